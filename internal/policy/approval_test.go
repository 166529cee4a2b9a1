package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSealer(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	s, err := NewSealer(5*time.Minute, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	args := []byte(`{"code": "print(1)", "timeout_seconds": 5}`)
	state, err := s.Seal("run_python", "alice", args)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(state, "print") || strings.Contains(state, "alice") {
		t.Errorf("state is not opaque: %s", state)
	}
	// Different requests, identities, tools; forged and tampered states.
	for _, tc := range []struct {
		name, state, tool, id, args string
		want                        error
	}{
		{"other code", state, "run_python", "alice", `{"code": "import os", "timeout_seconds": 5}`, ErrStateMismatch},
		{"other identity", state, "run_python", "bob", string(args), ErrStateMismatch},
		{"other tool", state, "install_package", "alice", string(args), ErrStateMismatch},
		{"forged", "approved", "run_python", "alice", string(args), ErrStateInvalid},
		{"empty", "", "run_python", "alice", string(args), ErrStateInvalid},
		{"tampered", state[:len(state)-2] + "AA", "run_python", "alice", string(args), ErrStateInvalid},
	} {
		if err := s.Open(tc.state, tc.tool, tc.id, []byte(tc.args)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Re-encoded arguments (other key order and spacing) still match.
	if err := s.Open(state, "run_python", "alice", []byte(`{"timeout_seconds":5,"code":"print(1)"}`)); err != nil {
		t.Fatalf("genuine retry: %v", err)
	}
	if err := s.Open(state, "run_python", "alice", args); !errors.Is(err, ErrStateUsed) {
		t.Errorf("replay: %v", err)
	}
	// Another server (another key) cannot open it.
	other, _ := NewSealer(5*time.Minute, clock.now)
	state2, _ := s.Seal("run_python", "alice", args)
	if err := other.Open(state2, "run_python", "alice", args); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("other key: %v", err)
	}
	clock.add(6 * time.Minute)
	if err := s.Open(state2, "run_python", "alice", args); !errors.Is(err, ErrStateExpired) {
		t.Errorf("expired: %v", err)
	}
}

func TestArgsDigest(t *testing.T) {
	a := ArgsDigest([]byte(`{"b": [1, 2.50], "a": "x"}`))
	if b := ArgsDigest([]byte(`{"a":"x","b":[1,2.50]}`)); a != b {
		t.Error("canonical forms differ")
	}
	if b := ArgsDigest([]byte(`{"a":"x","b":[1,2.5]}`)); a == b {
		t.Error("a different number must not match")
	}
}
