package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestReplicaHandoff: sessions outlive the replicas that stop. A replica
// told to stop (SIGTERM: a rolling update, a scale-down) pauses its
// session and hands it to the other; its owner's next call, through the
// other, resumes it with its variables and files, for that owner only,
// and it is listed once. The replica restarted (a new incarnation of the
// same name) sends calls on it to where it went; the session goes back to
// it when the other stops in turn; and the last replica, with no other to
// hand it to, keeps it on its volume and serves it again once restarted.
func TestReplicaHandoff(t *testing.T) {
	dir := t.TempDir()
	rs := startReplicasEach(t, 2, func(i int) []string {
		return []string{"--state-dir", filepath.Join(dir, fmt.Sprint("state-", i)), "--drain-timeout", "5s"}
	})
	ctx := context.Background()
	const alice, bob = "alice-0123456789abcdef", "bob-0123456789abcdef00"
	_, out := callTool(t, connectHTTP(ctx, t, rs.urls[0], alice), "create_session", nil)
	id, _ := out["session_id"].(string)
	if !strings.Contains(id, ".replica-0.") {
		t.Fatalf("session id %q does not name its replica", id)
	}
	res, _ := callTool(t, connectHTTP(ctx, t, rs.urls[0], alice), "run_python", map[string]any{"session_id": id,
		"code": "x = 41\ndef f(v):\n    return v + 1\nopen('notes.txt', 'w').write('kept')"})
	if res.IsError {
		t.Fatalf("%s", toolText(res))
	}
	// run asks for code's value through replica i until it is want: a
	// "retry" answer (the store, or a replica, not caught up yet on a
	// loaded machine) is asked again; anything else fails.
	run := func(i int, who, code string, want any) *mcp.CallToolResult {
		t.Helper()
		cs := connectHTTP(ctx, t, rs.urls[i], who)
		deadline := time.Now().Add(time.Minute)
		for {
			res, out := callTool(t, cs, "run_python", map[string]any{"session_id": id, "code": code})
			if !res.IsError && out["return_value"] == want {
				return res
			}
			if !strings.Contains(toolText(res), "retry") || time.Now().After(deadline) {
				t.Fatalf("through replica-%d: %s", i, toolText(res))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	stop := func(i int) {
		t.Helper()
		rs.cmds[i].Process.Signal(syscall.SIGTERM)
		waitExit(t, rs.cmds[i])
	}

	// Replica 0 stops: its session goes to replica 1.
	stop(0)
	if log := rs.logs[0].String(); !strings.Contains(log, "handed=1") {
		t.Fatalf("replica-0 did not hand its session over:\n%s", log)
	}
	if log := rs.logs[1].String(); !strings.Contains(log, "adopted a paused session") {
		t.Errorf("replica-1 did not log the adoption:\n%s", log)
	}
	// Bob cannot have it, paused or not.
	res, _ = callTool(t, connectHTTP(ctx, t, rs.urls[1], bob), "run_python", map[string]any{"session_id": id, "code": "x"})
	if !res.IsError || !strings.Contains(toolText(res), "Unknown session") {
		t.Errorf("bob's call on alice's handed session: %s", toolText(res))
	}
	start := time.Now()
	res = run(1, alice, "str(f(x)) + open('notes.txt').read()", "42kept")
	t.Logf("resumed through the other replica in %v: %.200s", time.Since(start).Round(time.Millisecond), toolText(res))
	_, out = callTool(t, connectHTTP(ctx, t, rs.urls[1], alice), "list_sessions", nil)
	if ss, _ := out["sessions"].([]any); len(ss) != 1 || !strings.Contains(fmt.Sprint(ss), id) {
		t.Errorf("alice's sessions after the handoff: %v", out)
	}

	// Replica 0 back, empty-handed: it sends the session's calls on.
	rs.restart(t, 0)
	run(0, alice, "x = 50\nx", float64(50))
	// A session file read through it too: the read goes where the session is.
	rr, err := connectHTTP(ctx, t, rs.urls[0], alice).ReadResource(ctx, &mcp.ReadResourceParams{URI: "pysandbox://sessions/" + id + "/files/notes.txt"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "kept" && string(rr.Contents[0].Blob) != "kept" {
		t.Errorf("the session's file through the replica it left: %v %+v", err, rr)
	}

	// Replica 1 stops: the session, running there, goes back to 0.
	stop(1)
	if log := rs.logs[1].String(); !strings.Contains(log, "handed=1") {
		t.Fatalf("replica-1 did not hand the session over:\n%s", log)
	}
	run(0, alice, "f(x)", float64(51))

	// The last replica stops: nobody to hand it to, it keeps it, and has
	// it again once restarted with its volume.
	stop(0)
	if log := rs.logs[0].String(); !strings.Contains(log, "no other replica runs") {
		t.Errorf("the last replica's log:\n%s", log)
	}
	rs.restart(t, 0)
	run(0, alice, "x + 2", float64(52))
	res, _ = callTool(t, connectHTTP(ctx, t, rs.urls[0], bob), "run_python", map[string]any{"session_id": id, "code": "x"})
	if !res.IsError || !strings.Contains(toolText(res), "Unknown session") {
		t.Errorf("bob's call on alice's kept session: %s", toolText(res))
	}
}

// TestKubernetesSessionsSurvive, on the real cluster (scripts/k8s/e2e.sh):
// a session on each replica, with variables, a function, an imported
// module's object and a file, survives a rolling update of the StatefulSet
// (each replica stops in turn and hands its sessions to the other) and
// then a scale-down from 2 to 1 (the leaving replica, with a session of
// its own then, hands them to the one that stays). Calls go through the
// Service, as an agent's do. The cluster is left with 2 replicas, as
// found.
func TestKubernetesSessionsSurvive(t *testing.T) {
	e := k8s(t)
	pods := e.waitReady(t, 2)
	// The image's Python has the standard library only.
	const state = "import collections\narr = collections.deque(range(100))\ndef f(v):\n    return sum(arr) + v\nopen('notes.txt', 'w').write('%s')\nn = %d"
	ids := map[string]string{} // session id: what its check returns
	// create makes a session at pod p, with state.
	create := func(p pod, n int) {
		t.Helper()
		cs := e.connect(t, podURL(p), "alice", nil, "")
		_, out := callTool(t, cs, "create_session", nil)
		id, _ := out["session_id"].(string)
		if !strings.Contains(id, "."+p.name+".") {
			t.Fatalf("session %q made through %s does not name it", id, p.name)
		}
		res, _ := callTool(t, cs, "run_python", map[string]any{"session_id": id, "code": fmt.Sprintf(state, p.name, n)})
		if res.IsError {
			t.Fatalf("%s: %s", p.name, toolText(res))
		}
		ids[id] = fmt.Sprintf("%d %s", 4950+n, p.name)
	}
	for i, p := range pods {
		create(p, i)
	}
	// check calls each session through the Service until it answers as it
	// should: "retry" answers (a replica not caught up yet) are asked
	// again, for a bounded time; anything else fails.
	check := func(when string) {
		t.Helper()
		start := time.Now()
		for id, want := range ids {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				cs := e.connect(t, e.service, "alice", nil, "")
				res, out := callTool(t, cs, "run_python", map[string]any{"session_id": id, "code": "str(f(n)) + ' ' + open('notes.txt').read()"})
				if !res.IsError && out["return_value"] == want {
					break
				}
				if !strings.Contains(toolText(res), "retry") || time.Now().After(deadline) {
					t.Fatalf("%s: session %s: %s", when, id, toolText(res))
				}
				time.Sleep(time.Second)
			}
		}
		t.Logf("%s: every session answered within %v", when, time.Since(start).Round(time.Millisecond))
	}

	start := time.Now()
	e.kubectl(t, "rollout", "restart", "statefulset/pysandbox")
	e.kubectl(t, "rollout", "status", "statefulset/pysandbox", "--timeout=300s")
	e.waitReady(t, 2)
	t.Logf("rolling update done in %v", time.Since(start).Round(time.Second))
	check("after a rolling update")

	// The replica a scale-down removes (the highest ordinal) holds a
	// session of its own then, whichever the update left them on.
	pods = e.waitReady(t, 2)
	create(pods[1], 2)
	// The HorizontalPodAutoscaler keeps at least 2 replicas: it is told
	// 1 for the time of the scale-down, as when it scales down itself.
	e.kubectl(t, "patch", "hpa", "pysandbox", "--type=merge", "-p", `{"spec":{"minReplicas":1}}`)
	defer func() {
		e.kubectl(t, "scale", "statefulset", "pysandbox", "--replicas=2")
		e.kubectl(t, "patch", "hpa", "pysandbox", "--type=merge", "-p", `{"spec":{"minReplicas":2}}`)
		e.waitReady(t, 2)
	}()
	start = time.Now()
	e.kubectl(t, "scale", "statefulset", "pysandbox", "--replicas=1")
	// Gone, not only unready: its sessions are handed over as it stops.
	deadline := time.Now().Add(2 * time.Minute)
	for left := e.pods(t); len(left) != 1 || left[0].name != pods[0].name; left = e.pods(t) {
		if time.Now().After(deadline) {
			t.Fatalf("still %+v two minutes after the scale-down", left)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("scaled down in %v", time.Since(start).Round(time.Second))
	check("after a scale-down to 1")
	// Closed, as any session: they count against alice's quota, which the
	// tests after this one use.
	cs := e.connect(t, e.service, "alice", nil, "")
	for id := range ids {
		if res, _ := callTool(t, cs, "close_session", map[string]any{"session_id": id}); res.IsError {
			t.Errorf("close %s: %s", id, toolText(res))
		}
	}
}
