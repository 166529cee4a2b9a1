package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/testutil"
)

// proc is a host process, named by pid and start time so that a recycled
// pid is not mistaken for it.
type proc struct {
	pid int
	testutil.ProcStat
}

// descendants lists every process below root on the host.
func descendants(root int) []proc {
	children := map[int][]proc{}
	testutil.HostProcs(func(dir string) bool {
		pid, _ := strconv.Atoi(filepath.Base(dir))
		if st, ok := testutil.ReadProcStat(pid); ok {
			children[st.PPid] = append(children[st.PPid], proc{pid, st})
		}
		return false
	})
	var out []proc
	queue := []int{root}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out
}

// alive says whether p still runs; a zombie is dead, only not yet reaped
// by whoever inherited it.
func alive(p proc) bool {
	now, ok := testutil.ReadProcStat(p.pid)
	return ok && now.Start == p.Start && !now.Dead()
}

// A server killed with SIGKILL gets no chance to clean up. Its sandboxes
// must still die with it (parent-death signal on every sandbox's pid 1,
// whose death takes its pid namespace along): the warm pool, a session
// with a background process, and a run in flight.
func TestServerKilledTakesSandboxesWithIt(t *testing.T) {
	for _, backend := range []string{"native", "bwrap"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "bwrap" {
				if _, err := exec.LookPath("bwrap"); err != nil {
					t.Skip("bwrap is not installed (apt-get install bubblewrap)")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.Command(binary(t), "serve", "--log-level", "error", "--sandbox", backend)
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
			if err != nil || res.IsError {
				t.Fatalf("create_session: %v %+v", err, res)
			}
			id := res.StructuredContent.(map[string]any)["session_id"].(string)
			res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
				"session_id": id, "code": "import subprocess\np = subprocess.Popen(['sleep', '300'])\np.pid"}})
			if err != nil || res.IsError {
				t.Fatalf("session run: %v %+v", err, res)
			}
			// A run in flight when the server dies.
			go cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{
				"code": "import subprocess, time\nsubprocess.Popen(['sleep', '301'])\ntime.sleep(300)", "timeout_seconds": 120}})

			// Wait until the host shows the sleeping processes.
			var before []proc
			deadline := time.Now().Add(20 * time.Second)
			for {
				before = descendants(cmd.Process.Pid)
				sleeps := 0
				for _, p := range before {
					if p.Comm == "sleep" {
						sleeps++
					}
				}
				if sleeps == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the sandboxes did not show up under the server: %+v", before)
				}
				time.Sleep(50 * time.Millisecond)
			}

			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(10 * time.Second)
			for {
				var left []proc
				for _, p := range before {
					if alive(p) {
						left = append(left, p)
					}
				}
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d sandbox processes outlived the killed server: %+v", len(left), len(before), left)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%d sandbox processes went with the server", len(before))

			// Its cgroups stayed behind (nobody was left to delete them);
			// the next server to start removes them, and only them.
			pid := cmd.Process.Pid
			left := func() []string {
				var out []string
				for _, pat := range []string{"/sys/fs/cgroup/*/pysandbox/sb-%d-*", "/sys/fs/cgroup/*/pysandbox/pool-%d-*", "/sys/fs/cgroup/*/*/*/pysandbox/sb-%d-*", "/sys/fs/cgroup/*/*/*/pysandbox/pool-%d-*"} {
					m, _ := filepath.Glob(fmt.Sprintf(pat, pid))
					out = append(out, m...)
				}
				return out
			}
			if os.Geteuid() == 0 && len(left()) == 0 {
				t.Errorf("no cgroups of the killed server found: the reclaim below checks nothing")
			}
			if _, stderr, code := runBin(t, "", "check"); code != 0 {
				t.Fatalf("check after the kill: exit %d: %s", code, stderr)
			}
			if l := left(); len(l) > 0 {
				t.Errorf("cgroups of the killed server left after the next server started: %v", l)
			}
		})
	}
}
