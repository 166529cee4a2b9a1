package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSplitArgs(t *testing.T) {
	rt, img, rest, err := SplitArgs([]string{"--log-level", "warn", "--container", "podman", "--console", "-image=x:1", "--policy", "p"})
	if err != nil || rt != "podman" || img != "x:1" || !slices.Equal(rest, []string{"--log-level", "warn", "--console", "--policy", "p"}) {
		t.Fatalf("%q %q %q %v", rt, img, rest, err)
	}
	if _, _, _, err := SplitArgs([]string{"--container"}); err == nil {
		t.Fatal("--container without a value accepted")
	}
}

func TestTranslate(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	os.WriteFile(pol, []byte("{}"), 0o644)
	t.Chdir(dir)
	out, mounts, vol, err := Translate([]string{"--policy", "policy.json", "--audit-sync-each", "--audit-log=" + filepath.Join(dir, "logs", "..", "audit.log"), "--max-timeout", "60"}, "linux")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--policy", pol, "--audit-sync-each", "--audit-log=" + filepath.Join(dir, "audit.log"), "--max-timeout", "60"}
	if !slices.Equal(out, want) || !vol {
		t.Fatalf("args %q (want %q), cache volume %v", out, want, vol)
	}
	wantMounts := []Mount{{Source: pol, Target: pol, ReadOnly: true}, {Source: dir, Target: dir}}
	if !slices.Equal(mounts, wantMounts) {
		t.Fatalf("mounts %+v, want %+v", mounts, wantMounts)
	}
	if mounts[0].String() != "type=bind,source="+pol+",target="+pol+",readonly" {
		t.Fatal(mounts[0].String())
	}
	// A cache directory replaces the volume.
	_, mounts, vol, err = Translate([]string{"--cache-dir", dir}, "darwin")
	if err != nil || vol || len(mounts) != 1 || mounts[0].ReadOnly {
		t.Fatalf("%+v %v %v", mounts, vol, err)
	}
	// Refusals, each saying why.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "127.0.0.1:8080"}, "stdio"},
		{[]string{"--policy", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"--policy", dir}, "not a regular file"},
		{[]string{"--python", "/usr/bin/python3"}, "image's Python"},
		{[]string{"--audit-log", filepath.Join(dir, "nodir", "a.log")}, "does not exist"},
		{[]string{"extra"}, "no arguments"},
		{[]string{"--policy"}, "needs an argument"},
	} {
		if _, _, _, err := Translate(c.args, "linux"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
	// A version of Python passes; a URL wheelhouse is no mount.
	out, mounts, _, err = Translate([]string{"--python", "3.11", "--find-links", "https://example.com/w"}, "linux")
	if err != nil || len(mounts) != 0 || out[1] != "3.11" {
		t.Fatalf("%q %+v %v", out, mounts, err)
	}
	// Download metadata: a URL passes, a file is mounted read-only.
	meta := filepath.Join(dir, "download-metadata.json")
	os.WriteFile(meta, []byte("{}"), 0o644)
	out, mounts, _, err = Translate([]string{"--python-downloads-json-url", "https://example.com/m.json", "--python-downloads-json-url", meta}, "linux")
	if err != nil || len(mounts) != 1 || !mounts[0].ReadOnly || mounts[0].Source != meta || out[1] != "https://example.com/m.json" || out[3] != meta {
		t.Fatalf("metadata: %q %+v %v", out, mounts, err)
	}
}

func TestContainerPath(t *testing.T) {
	for _, c := range []struct {
		path string
		dir  bool
		want string
	}{
		{"/home/a/policy.json", false, "/home/a/policy.json"},
		{"/Users/a/audit", true, "/Users/a/audit"},
		{"/etc/pysandbox/policy.json", false, "/host/etc/pysandbox/policy.json"},
		{"/usr/local/bin", true, "/host/usr/local/bin"},
		{"/tmp", true, "/host/tmp"},
		{"/tmp/x.json", false, "/tmp/x.json"},
		{"/", true, "/host"},
	} {
		if got, err := containerPath(c.path, "linux", c.dir); err != nil || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.path, got, err, c.want)
		}
	}
}

func TestRunArgs(t *testing.T) {
	a := RunArgs("pysandbox:1", "/tmp/s.json", []string{"nofile=1024:4096"}, []Mount{{Source: "/a", Target: "/a", ReadOnly: true}}, true, []string{"--log-level", "debug"})
	got := strings.Join(a, " ")
	want := "run -i --rm --pull never --cap-add SYS_ADMIN,NET_ADMIN,SETUID,SETGID,SYS_CHROOT,DAC_OVERRIDE,SETPCAP,KILL --security-opt seccomp=/tmp/s.json --security-opt systempaths=unconfined --security-opt apparmor=unconfined --ulimit nofile=1024:4096 --volume pysandbox-cache:/var/cache/pysandbox --mount type=bind,source=/a,target=/a,readonly pysandbox:1 serve --log-level debug"
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

func TestFindRuntime(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := FindRuntime(""); err == nil || !strings.Contains(err.Error(), "Podman") {
		t.Fatalf("%v", err)
	}
	if _, err := FindRuntime("nerdctl"); err == nil || !strings.Contains(err.Error(), "--container nerdctl") {
		t.Fatalf("%v", err)
	}
}
