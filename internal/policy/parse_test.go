package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseYAML(t *testing.T) {
	p, err := Parse([]byte(`
version: "1"
default: allow
tools:
  run_python:
    action: approve
    limits:
      - {counter: runs, window: second, max: 2, scope: client}
packages:
  deny: ["*miner*"]
`), "policy.yaml", testTools)
	if err != nil {
		t.Fatal(err)
	}
	if p.Decide("run_python").Action != Approve || p.Decide("validate_script").Action != Allow {
		t.Errorf("%+v", p.Tools)
	}
	if err := p.Packages.Check("XMRig_Miner"); err == nil {
		t.Error("deny glob did not match")
	}
}

// TestParseErrors: every bad policy stops with a message naming the field.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"empty", ``, "the file is empty"},
		{"not object", `[1]`, "want an object"},
		{"bad json", `{"version": "1",}`, "invalid JSON"},
		{"trailing", `{"version": "1"} {}`, "data after"},
		{"dup key", `{"version": "1", "default": "allow", "default": "deny"}`, "default: the key appears twice"},
		{"dup nested", `{"version": "1", "tools": {"run_python": {"action": "allow", "action": "deny"}}}`, "tools.run_python.action: the key appears twice"},
		{"dup yaml", "version: '1'\ndefault: allow\ndefault: deny\n", "already defined"},
		{"no version", `{"default": "allow"}`, `version: missing`},
		{"version 2", `{"version": "2"}`, `version: "2" is not supported`},
		{"unknown top", `{"version": "1", "defualt": "allow"}`, "defualt: unknown field"},
		{"bad default", `{"version": "1", "default": "maybe"}`, `default: "maybe" is not an action`},
		{"unknown tool", `{"version": "1", "tools": {"run_pyton": {"action": "deny"}}}`, "tools.run_pyton: this server has no such tool; its tools are run_python"},
		{"tool not object", `{"version": "1", "tools": {"run_python": "deny"}}`, "tools.run_python: want an object"},
		{"bad action", `{"version": "1", "tools": {"run_python": {"action": "alow"}}}`, `tools.run_python.action: "alow" is not an action`},
		{"unknown tool field", `{"version": "1", "tools": {"run_python": {"acton": "deny"}}}`, "tools.run_python.acton: unknown field"},
		{"limits not list", `{"version": "1", "tools": {"run_python": {"limits": {}}}}`, "tools.run_python.limits: want a list"},
		{"bad window", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "fortnight", "max": 1}]}}}`, `tools.run_python.limits[0].window: "fortnight" is not a window`},
		{"no counter", `{"version": "1", "tools": {"run_python": {"limits": [{"window": "minute", "max": 1}]}}}`, `limits[0].counter`},
		{"negative quota", `{"version": "1", "quotas": {"runs": -1}}`, `quotas.runs: want a whole number`},
		{"unknown quota", `{"version": "1", "quotas": {"cpu": 2}}`, `quotas.cpu: unknown field`},
		{"identity quota", `{"version": "1", "quotas": {"identities": {"bob": {"runs": "two"}}}}`, `quotas.identities.bob.runs: want a whole number`},
		{"identities not an object", `{"version": "1", "quotas": {"identities": ["bob"]}}`, `quotas.identities: want an object`},
		{"zero max", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": 0}]}}}`, `limits[0].max: want a whole number`},
		{"float max", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": 1.5}]}}}`, `limits[0].max`},
		{"huge max", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": 99999999999999999999}]}}}`, `limits[0].max`},
		{"string max", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": "10"}]}}}`, `limits[0].max`},
		{"bad scope", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": 1, "scope": "user"}]}}}`, `limits[0].scope: "user" is not a scope`},
		{"second limit bad", `{"version": "1", "tools": {"run_python": {"limits": [{"counter": "c", "window": "minute", "max": 1}, {"counter": "c", "window": "week", "max": 1}]}}}`, `limits[1].window`},
		{"packages unknown", `{"version": "1", "packages": {"allowed": ["x"]}}`, "packages.allowed: unknown field"},
		{"packages empty allow", `{"version": "1", "packages": {"allow": []}}`, "packages.allow: an empty list would refuse every package"},
		{"bad glob", `{"version": "1", "packages": {"deny": ["[abc"]}}`, `packages.deny[0]: "[abc" is not a valid pattern`},
		{"slash glob", `{"version": "1", "packages": {"allow": ["../x"]}}`, `packages.allow[0]`},
		{"glob not string", `{"version": "1", "packages": {"allow": [1]}}`, `packages.allow[0]: want a string`},
		{"deep", `{"version": "1", "x": ` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "nested too deeply"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "p.json", testTools)
			if err == nil {
				t.Fatalf("accepted %s", tc.doc)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("%T %v is not a *policy.Error", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "policy p.json: ") {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseDefaultIsDeny(t *testing.T) {
	p, err := Parse([]byte(`{"version": 1}`), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	if p.Decide("run_python").Action != Deny {
		t.Error("a policy without default must deny")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.json"), testTools); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600)
	if _, err := Load(big, testTools); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
	// The shipped example policy must load and be strict.
	p, err := Load("../../examples/policy.json", []string{"run_python", "check_environment", "validate_script", "create_session", "list_sessions",
		"close_session", "install_package", "upload_file", "list_files", "download_file"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Default != Deny || p.Source != "../../examples/policy.json" {
		t.Errorf("example policy: default %s", p.Default)
	}
	if p.Decide("install_package").Action != Approve || len(p.Decide("run_python").Limits) == 0 || p.Packages.Empty() {
		t.Errorf("the example policy should approve installs, rate-limit runs and restrict packages: %+v", p)
	}
}

// FuzzParse: no input makes Parse panic, and what it accepts is a
// complete policy.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":"1","default":"deny","tools":{"run_python":{"action":"allow","limits":[{"counter":"runs","window":"minute","max":10,"scope":"grant"}]}},"packages":{"allow":["numpy","pandas*"],"deny":["*miner*"]}}`), "p.json")
	f.Add([]byte("version: '1'\ntools:\n  run_python: {action: approve}\n"), "p.yaml")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		p, err := Parse(data, name, testTools)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if p.Version != "1" {
			t.Fatalf("accepted version %q", p.Version)
		}
		for _, a := range append([]Action{p.Default}, func() (as []Action) {
			for _, r := range p.Tools {
				as = append(as, r.Action)
				for _, l := range r.Limits {
					if l.Max < 1 || l.Period <= 0 || l.Counter == "" {
						t.Fatalf("accepted limit %+v", l)
					}
				}
			}
			return
		}()...) {
			if a != Allow && a != Deny && a != Approve {
				t.Fatalf("accepted action %q", a)
			}
		}
	})
}
