package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

func TestMaxSessions(t *testing.T) {
	s := newSessions(t, nil, SessionConfig{MaxSessions: 2})
	create(t, s)
	create(t, s)
	if _, err := s.Create(context.Background(), 0); !errors.Is(err, ErrTooManySessions) || !strings.Contains(err.Error(), "close_session") {
		t.Fatalf("third session: %v", err)
	}
	// The memory budget: room for one session of 256 MiB, not two.
	s2 := newSessions(t, nil, SessionConfig{MemoryBudget: 300 << 20})
	create(t, s2)
	if _, err := s2.Create(context.Background(), 0); !errors.Is(err, ErrTooManySessions) || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("second session over the memory budget: %v", err)
	}
}

// TestDetachedSessions: a session whose connection has ended stops
// counting against its owner's quota, is reattached by use, and is the
// one closed to make room on a full server; a session in use is not.
func TestDetachedSessions(t *testing.T) {
	var mu sync.Mutex
	ended := map[string]bool{}
	s := newSessions(t, nil, SessionConfig{MaxSessions: 2, OwnerLimit: func(string) int { return 1 }})
	s.SetDetached(func(h string) bool { mu.Lock(); defer mu.Unlock(); return ended[h] })
	mk := func(holder string) (string, error) {
		info, err := s.Create(context.Background(), 0, CreateOptions{Owner: "anon", Holder: holder})
		if err != nil {
			return "", err
		}
		return info.ID, nil
	}
	a, err := mk("conn-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mk("conn-b"); !errors.Is(err, ErrSessionQuota) || !strings.Contains(err.Error(), "close one with close_session") {
		t.Fatalf("over the owner's quota: %v", err)
	}
	mu.Lock()
	ended["conn-a"] = true
	mu.Unlock()
	b, err := mk("conn-b")
	if err != nil {
		t.Fatalf("a detached session still counts: %v", err)
	}
	// Reattached by use: it counts again.
	s.Attach(a, "conn-c")
	if _, err := mk("conn-d"); !errors.Is(err, ErrSessionQuota) {
		t.Fatalf("a reattached session does not count: %v", err)
	}
	// The server is full (a, b); b's connection ends, and a new session
	// takes b's place, not a's (whose connection lives).
	mu.Lock()
	ended["conn-b"], ended["conn-c"] = true, false
	mu.Unlock()
	s.Attach(a, "")
	c, err := s.Create(context.Background(), 0, CreateOptions{Owner: "other"})
	if err != nil {
		t.Fatalf("a full server with a detached session: %v", err)
	}
	var gone *SessionGoneError
	if _, err := s.Run(context.Background(), b, RunRequest{Code: "1"}); !errors.As(err, &gone) || !strings.Contains(err.Error(), "closed to make room") {
		t.Errorf("the evicted session: %v", err)
	}
	srun(t, s, a, "1")
	// Nothing detached: the server's cap holds, and says how to get out.
	if _, err := s.Create(context.Background(), 0, CreateOptions{Owner: "third"}); !errors.Is(err, ErrTooManySessions) || !strings.Contains(err.Error(), "idle for") {
		t.Errorf("a full server: %v (sessions %s, %s)", err, a, c.ID)
	}
}
