package tools

import (
	"strings"
	"testing"
)

func TestCheckEnvironment(t *testing.T) {
	cs := connect(t, nil)
	res, out := call(t, cs, "check_environment", map[string]any{})
	if res.IsError {
		t.Fatalf("isError: %s", text(res))
	}
	if out["backend"] != "native" || out["posture"] != "sandboxed" {
		t.Fatalf("backend %v posture %v; problems %v", out["backend"], out["posture"], out["problems"])
	}
	layers := out["layers"].(map[string]any)
	for _, name := range []string{"user_namespace", "mount_namespace", "pid_namespace", "net_namespace", "ipc_namespace",
		"uts_namespace", "seccomp", "no_new_privs", "capabilities_dropped", "rlimits", "read_only_root", "unprivileged_user"} {
		l, _ := layers[name].(map[string]any)
		if l["active"] != true {
			t.Errorf("layer %s not active: %v", name, l)
		}
	}
	if !strings.HasPrefix(out["network"].(string), "none") {
		t.Errorf("network %v", out["network"])
	}
	limits := out["limits"].(map[string]any)
	if limits["memory_bytes"] != float64(256<<20) || limits["max_procs"] != 64.0 {
		t.Errorf("limits %v", limits)
	}
	if py, _ := out["python"].(map[string]any); py["version"] == "" || py["path"] == "" {
		t.Errorf("python %v", out["python"])
	}
	if its, _ := out["interpreters"].([]any); len(its) == 0 {
		t.Error("no interpreters reported")
	}
	if !strings.Contains(text(res), "posture: SANDBOXED") {
		t.Errorf("text %q", text(res))
	}
}
