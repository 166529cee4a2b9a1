// Package kubernetes holds pysandbox's Kubernetes manifests; its tests
// check them (the end-to-end test, scripts/k8s/e2e.sh, installs them).
package kubernetes

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSeccompProfile: the shipped profile is the runtime default plus
// what the sandbox's setup needs, and no more than that.
func TestSeccompProfile(t *testing.T) {
	data, err := os.ReadFile("seccomp/pysandbox.json")
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
			Args   []any    `json:"args"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("default action %s", p.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, s := range p.Syscalls {
		if s.Action == "SCMP_ACT_ALLOW" && len(s.Args) == 0 {
			for _, n := range s.Names {
				allowed[n] = true
			}
		}
	}
	for _, n := range []string{"mount", "umount2", "unshare", "setns", "pivot_root", "clone3", "sethostname", "seccomp", "landlock_create_ruleset"} {
		if !allowed[n] {
			t.Errorf("%s is not allowed: the sandbox's setup needs it", n)
		}
	}
	for _, n := range []string{"kexec_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "open_by_handle_at", "acct"} {
		if allowed[n] {
			t.Errorf("%s is allowed: no default allows it, and pysandbox does not need it", n)
		}
	}
	man, _ := os.ReadFile("base/statefulset.yaml")
	if !strings.Contains(string(man), "localhostProfile: profiles/pysandbox.json") {
		t.Error("the StatefulSet does not use the shipped profile")
	}
}

// TestManifestsRender: every kustomization renders.
func TestManifestsRender(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl here; scripts/k8s/e2e.sh renders and installs the test overlay")
	}
	for _, dir := range []string{"base", "overlays/privileged", "overlays/test"} {
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", dir, err, out)
			continue
		}
		for _, kind := range []string{"kind: StatefulSet", "kind: Service", "kind: PodDisruptionBudget", "kind: HorizontalPodAutoscaler", "kind: ConfigMap", "kind: ServiceAccount"} {
			if !strings.Contains(string(out), kind) {
				t.Errorf("%s renders no %s", dir, kind)
			}
		}
	}
}
