// Package kubernetes holds pysandbox's Kubernetes manifests; its tests
// check them (the end-to-end test, scripts/k8s/e2e.sh, installs them).
package kubernetes

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
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

// TestStatefulSetKeepsSessions: paused sessions are kept on the replica's
// own volume (a volumeClaimTemplate), which outlives the pod, and the pod
// is given the time to drain, pause and hand its sessions over before it
// is killed: --drain-timeout, 5 s of handoff, and 10 s for the endpoints
// to stop.
func TestStatefulSetKeepsSessions(t *testing.T) {
	data, err := os.ReadFile("base/statefulset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sts struct {
		Spec struct {
			Template struct {
				Spec struct {
					Grace      int `yaml:"terminationGracePeriodSeconds"`
					Containers []struct {
						Args         []string `yaml:"args"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
			Claims []struct {
				Metadata struct {
					Name string `yaml:"name"`
				} `yaml:"metadata"`
			} `yaml:"volumeClaimTemplates"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &sts); err != nil {
		t.Fatal(err)
	}
	spec := sts.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	state, drain := "", 25*time.Second
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--state-dir="); ok {
			state = v
		}
		if v, ok := strings.CutPrefix(a, "--drain-timeout="); ok {
			if drain, err = time.ParseDuration(v); err != nil {
				t.Errorf("--drain-timeout=%s: %v", v, err)
			}
		}
	}
	claims := map[string]bool{}
	for _, cl := range sts.Spec.Claims {
		claims[cl.Metadata.Name] = true
	}
	onVolume := false
	for _, m := range c.VolumeMounts {
		if claims[m.Name] && state != "" && strings.HasPrefix(state+"/", strings.TrimSuffix(m.MountPath, "/")+"/") {
			onVolume = true
		}
	}
	if !onVolume {
		t.Errorf("--state-dir %q is not on the replica's own volume (a volumeClaimTemplate's mount)", state)
	}
	if need := drain + 15*time.Second; time.Duration(spec.Grace)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %d: the drain (%v), the handoff and the stop need %v", spec.Grace, drain, need)
	}
}
