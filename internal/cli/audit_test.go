package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/sharedstate"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// auditLog writes n run_python calls to a new log and returns its path.
func auditLog(t *testing.T, n int, opts audit.Options) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	w, err := audit.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		exit := 0
		r := &audit.Record{Event: audit.EventCall, Identity: "alice", Tool: "run_python",
			Arguments: json.RawMessage(fmt.Sprintf(`{"code":"print(%d)"}`, i)),
			Decision:  "allow", Status: "success", ExitCode: &exit, DurationMS: 12}
		if err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestAuditVerifyOK(t *testing.T) {
	path := auditLog(t, 30, audit.Options{MaxSize: 2000})
	var out, errb bytes.Buffer
	if err := auditCmd([]string{"verify", path}, &out, &errb); err != nil {
		t.Fatalf("verify: %v", err)
	}
	files, _ := audit.Files(path)
	if len(files) < 2 {
		t.Fatalf("no rotation: %v", files)
	}
	// Each rotation adds a rotate record to the chain.
	want := fmt.Sprintf("ok: %d records (seq 1..%d) in %d files, head sha256 ", 30+len(files)-1, 30+len(files)-1, len(files))
	if !strings.HasPrefix(out.String(), want) {
		t.Errorf("output %q, want %q...", out.String(), want)
	}
	// Through Main, as users run it: exit 0, and 1 on a bad chain.
	out.Reset()
	if code := Main([]string{"audit", "verify", path}, nil, &out, &errb); code != 0 {
		t.Errorf("Main exit %d: %s", code, errb.String())
	}
	os.WriteFile(path+".1", []byte("{}\n"), 0o600)
	errb.Reset()
	if code := Main([]string{"audit", "verify", path}, nil, &out, &errb); code != 1 || !strings.Contains(errb.String(), "pysandbox: audit verify: "+path+".1:1: malformed line") {
		t.Errorf("Main exit %d: %s", code, errb.String())
	}
}

func TestAuditVerifyFindsTampering(t *testing.T) {
	for name, tt := range map[string]struct {
		tamper func(lines []string) []string
		want   string
	}{
		"edited": {func(l []string) []string {
			l[4] = strings.Replace(l[4], "print(4)", "print(5)", 1)
			return l
		}, "audit.log:5 (seq 5): record edited"},
		"deleted": {func(l []string) []string { return append(l[:4], l[5:]...) },
			"audit.log:5 (seq 6): chain broken: seq 6 follows seq 4: a record before this one was deleted or reordered"},
	} {
		t.Run(name, func(t *testing.T) {
			path := auditLog(t, 8, audit.Options{})
			b, _ := os.ReadFile(path)
			lines := strings.SplitAfter(string(b), "\n")
			os.WriteFile(path, []byte(strings.Join(tt.tamper(lines), "")), 0o600)
			var out, errb bytes.Buffer
			err := auditCmd([]string{"verify", path}, &out, &errb)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("verify: %v, want %q", err, tt.want)
			}
			var ve *audit.VerifyError
			var ue usageError
			if !errors.As(err, &ve) || errors.As(err, &ue) {
				t.Errorf("error %T: want a *VerifyError, not a usage error (exit 1)", err)
			}
			if out.Len() > 0 {
				t.Errorf("printed %q on failure", out.String())
			}
		})
	}
}

func TestAuditVerifyGivenFiles(t *testing.T) {
	path := auditLog(t, 30, audit.Options{MaxSize: 2000})
	// Given explicitly, only those files, in that order: the last alone
	// verifies, starting past seq 1.
	var out, errb bytes.Buffer
	if err := auditCmd([]string{"verify", path, path}, &out, &errb); err == nil {
		t.Error("a file given twice verified")
	}
	out.Reset()
	if err := auditCmd([]string{"verify", path + ".1", path + ".2"}, &out, &errb); err != nil || !strings.Contains(out.String(), "in 2 files") {
		t.Errorf("two files: %v %q", err, out.String())
	}
}

func TestAuditUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.log")
	for _, args := range [][]string{nil, {"frob"}, {"verify"}, {"tail"}, {"tail", "-n", "-1", "x"}, {"tail", "a", "b"}} {
		var out, errb bytes.Buffer
		var ue usageError
		if err := auditCmd(args, &out, &errb); !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out, errb bytes.Buffer
	var fe flagError
	if err := auditCmd([]string{"tail", "--bogus", "x"}, &out, &errb); !errors.As(err, &fe) {
		t.Errorf("unknown flag: %v", err)
	}
	for _, args := range [][]string{{"verify", missing}, {"tail", missing}} {
		if err := auditCmd(args, &out, &errb); err == nil || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("%q: %v", args, err)
		}
	}
}

func TestAuditTail(t *testing.T) {
	path := auditLog(t, 5, audit.Options{})
	var out, errb bytes.Buffer
	if err := auditCmd([]string{"tail", "-n", "2", path}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines:\n%s", out.String())
	}
	for i, l := range lines {
		for _, want := range []string{fmt.Sprintf("  #%d  alice  run_python  allow  success exit=0 12ms", 4+i), fmt.Sprintf(`code="print(%d)"`, 3+i)} {
			if !strings.Contains(l, want) {
				t.Errorf("line %d %q lacks %q", i, l, want)
			}
		}
	}

	out.Reset()
	if err := auditCmd([]string{"tail", "-n", "2", "--json", path}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	all := strings.SplitAfter(string(b), "\n")
	if want := all[3] + all[4]; out.String() != want {
		t.Errorf("--json:\n%s\nwant:\n%s", out.String(), want)
	}

	// The default is 20, which is more than there are.
	out.Reset()
	if err := auditCmd([]string{"tail", path}, &out, &errb); err != nil || strings.Count(out.String(), "\n") != 5 {
		t.Errorf("default -n: %v\n%s", err, out.String())
	}
}

// startedLog writes a log as a server does: a start record (naming
// replica, if any), then n run_python calls, the second running
// os.system("id"); it returns its path and head.
func startedLog(t *testing.T, path, replica string, n int, opts audit.Options) (seq int64, head string) {
	t.Helper()
	w, err := audit.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	detail := map[string]string{"version": "test"}
	if replica != "" {
		detail["replica"], detail["incarnation"] = replica, "0011aabb"
	}
	if err := w.Append(&audit.Record{Event: audit.EventStart, Detail: detail}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		code := fmt.Sprintf("print(%d)", i)
		if i == 1 {
			code = `import os; os.system("id")`
		}
		args, _ := json.Marshal(map[string]string{"code": code})
		if err := w.Append(&audit.Record{Event: audit.EventCall, Identity: "alice", Tool: "run_python", Arguments: args, Decision: "allow"}); err != nil {
			t.Fatal(err)
		}
	}
	seq, head = w.Head()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return seq, head
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := strings.SplitAfter(string(b), "\n")
	return l[:len(l)-1] // the "" after the last newline
}

func writeFile(t *testing.T, path string, lines []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAuditVerifyCuts: a log whose first records were cut, or whose last
// ones were (against --head), or a rotated set missing its oldest or
// newest file, fails with exit 1 and a message naming the cut; files
// removed on purpose pass with the --from-seq the message names, and the
// log as written passes.
func TestAuditVerifyCuts(t *testing.T) {
	type setup struct {
		path, head string
		files      []string
	}
	single := func(t *testing.T) setup {
		path := filepath.Join(t.TempDir(), "audit.log")
		_, head := startedLog(t, path, "", 6, audit.Options{})
		return setup{path: path, head: head, files: []string{path}}
	}
	rotated := func(t *testing.T) setup {
		path := filepath.Join(t.TempDir(), "audit.log")
		_, head := startedLog(t, path, "", 30, audit.Options{MaxSize: 1500})
		files, _ := audit.Files(path)
		if len(files) < 4 {
			t.Fatalf("files %v: want rotation", files)
		}
		return setup{path: path, head: head, files: files}
	}
	tests := []struct {
		name  string
		make  func(*testing.T) setup
		cut   func(t *testing.T, s setup)
		head  bool   // give --head
		want  string // in the message
		allow string // the --from-seq the message asks for, when allowed
	}{
		{"start record and os.system call cut", single, func(t *testing.T, s setup) {
			writeFile(t, s.path, lines(t, s.path)[2:])
		}, false, `audit.log:1 (seq 3): the chain starts at seq 3 with a "call" record, not at seq 1 nor with the rotate record a rotated file starts with: the 2 records before it were cut from the front of the file; if the records before seq 3 were removed on purpose (rotated files past their retention), pass --from-seq 3`, ""},
		{"record cut in the middle", single, func(t *testing.T, s setup) {
			l := lines(t, s.path)
			writeFile(t, s.path, append(l[:2:2], l[3:]...))
		}, false, "audit.log:3 (seq 4): chain broken: seq 4 follows seq 2", ""},
		{"last record cut", single, func(t *testing.T, s setup) {
			l := lines(t, s.path)
			writeFile(t, s.path, l[:len(l)-1])
		}, true, "audit.log:6 (seq 6): the chain ends at seq 6, and no record of it has the expected head", ""},
		{"oldest rotated file removed", rotated, func(t *testing.T, s setup) {
			os.Remove(s.files[0])
		}, true, "the rotate record that follows audit.log.1, which was not checked", "--from-seq "},
		{"front of the oldest rotated file cut", rotated, func(t *testing.T, s setup) {
			writeFile(t, s.files[0], lines(t, s.files[0])[2:])
		}, true, `audit.log.1:1 (seq 3): the chain starts at seq 3 with a "call" record`, ""},
		{"middle rotated file removed", rotated, func(t *testing.T, s setup) {
			os.Remove(s.files[1])
		}, true, "audit.log.3:1", ""},
		{"newest file removed", rotated, func(t *testing.T, s setup) {
			os.Remove(s.path)
		}, true, "no record of it has the expected head", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.make(t)
			args := []string{"audit", "verify"}
			if tt.head {
				args = append(args, "--head", s.head)
			}
			var out, errb bytes.Buffer
			if code := Main(append(args, s.path), nil, &out, &errb); code != 0 {
				t.Fatalf("the log as written: exit %d: %s", code, errb.String())
			}
			if tt.head && !strings.Contains(out.String(), "the expected head matches (seq ") {
				t.Errorf("the log as written: %s", out.String())
			}
			tt.cut(t, s)
			out.Reset()
			errb.Reset()
			code := Main(append(args, s.path), nil, &out, &errb)
			if code != 1 || !strings.Contains(errb.String(), tt.want) || out.Len() > 0 {
				t.Fatalf("exit %d, stdout %q, stderr:\n%s\nwant exit 1 and %q", code, out.String(), errb.String(), tt.want)
			}
			if tt.allow == "" {
				return
			}
			i := strings.Index(errb.String(), tt.allow)
			if i < 0 {
				t.Fatalf("the message does not say to pass %s: %s", tt.allow, errb.String())
			}
			from := strings.Fields(errb.String()[i+len(tt.allow):])[0]
			out.Reset()
			errb.Reset()
			if code := Main(append(args, "--from-seq", from, s.path), nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "the chain starts at seq "+from+", as --from-seq allows") {
				t.Errorf("with --from-seq %s: exit %d %s %s", from, code, out.String(), errb.String())
			}
		})
	}
}

func TestAuditVerifyFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	startedLog(t, path, "", 2, audit.Options{})
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--head", "abc"}, "--head \"abc\": want the 64 hex digits of a SHA-256"},
		{[]string{"--from-seq", "-1"}, "--from-seq -1: want a seq"},
		{[]string{"--replica-token-file", path}, "--replica-token-file goes with --store"},
		{[]string{"--store", "redis://127.0.0.1:1/0"}, "--store needs --replica-token-file"},
		{[]string{"--store", "redis://127.0.0.1:1/0", "--head", strings.Repeat("a", 64)}, "--head checks one chain"},
	} {
		var out, errb bytes.Buffer
		if code := Main(append(append([]string{"audit", "verify"}, tt.args...), path), nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%q: exit %d %s, want 2 and %q", tt.args, code, errb.String(), tt.want)
		}
	}
}

// anchoredChains are two replicas' chains, anchored in a real Redis as
// the replicas do it (replica-0 anchors again after replica-1, so its
// anchor names both), and the token file that signs the anchors.
type anchoredChains struct {
	url, token string
	chains     [2]string
	heads      [2]audit.Anchor
	store      *sharedstate.Store
	raw        *redis.Client
}

const anchorsKey = "{pysandbox}:audit-anchors"

func anchored(t *testing.T) *anchoredChains {
	t.Helper()
	r := redisserver.Start(t)
	dir := t.TempDir()
	ac := &anchoredChains{url: r.URL(), token: filepath.Join(dir, "replica-token")}
	os.WriteFile(ac.token, []byte("0123456789abcdef0123456789abcdef-replicas\n"), 0o600)
	st, err := sharedstate.Open(context.Background(), r.URL(), sharedstate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.UseReplicaKey([]byte("0123456789abcdef0123456789abcdef-replicas"))
	ac.store = st
	for i := range 2 {
		name := fmt.Sprintf("replica-%d", i)
		ac.chains[i] = filepath.Join(dir, name+".log")
		seq, head := startedLog(t, ac.chains[i], name, 4+i, audit.Options{})
		ac.heads[i] = audit.Anchor{Seq: seq, Head: head}
		if err := st.SetAnchor(context.Background(), name, ac.heads[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetAnchor(context.Background(), "replica-0", ac.heads[0]); err != nil {
		t.Fatal(err)
	}
	ac.raw = redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { ac.raw.Close() })
	return ac
}

func (ac *anchoredChains) verify(chains ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Main(append([]string{"audit", "verify", "--store", ac.url, "--replica-token-file", ac.token}, chains...), nil, &out, &errb)
	return code, out.String(), errb.String()
}

// TestAuditVerifyStore: the replicas' chains pass against their signed
// anchors; a forged anchor (a shorter head, unsigned or under another
// token), an anchor deleted, or a chain left out, fails with exit 1
// naming the problem.
func TestAuditVerifyStore(t *testing.T) {
	t.Run("whole", func(t *testing.T) {
		ac := anchored(t)
		code, out, errOut := ac.verify(ac.chains[:]...)
		if code != 0 || !strings.Contains(out, "ok: 2 chains match their anchors") || !strings.Contains(out, "replica-1: the anchored head matches (seq 6, the last record)") {
			t.Errorf("exit %d\n%s%s", code, out, errOut)
		}
	})
	// The records after seq 4 of replica-1 cut, and its anchor replaced
	// by one of seq 4.
	shorter := func(t *testing.T, ac *anchoredChains) audit.Anchor {
		l := lines(t, ac.chains[1])
		writeFile(t, ac.chains[1], l[:4])
		rep, err := audit.Verify([]string{ac.chains[1]})
		if err != nil {
			t.Fatal(err)
		}
		return audit.Anchor{Seq: rep.LastSeq, Head: rep.Head}
	}
	for name, forge := range map[string]func(a audit.Anchor) audit.Anchor{
		"forged anchor, unsigned": func(a audit.Anchor) audit.Anchor { return a },
		"forged anchor, another token": func(a audit.Anchor) audit.Anchor {
			return a.Sign("replica-1", []byte("the token of a test deployment!!"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			ac := anchored(t)
			forged, _ := json.Marshal(forge(shorter(t, ac)))
			ac.raw.HSet(context.Background(), anchorsKey, "replica-1", forged)
			code, _, errOut := ac.verify(ac.chains[:]...)
			if code != 1 || !strings.Contains(errOut, "the audit anchor of replica-1 in the store: the anchor is not signed") && !strings.Contains(errOut, "the audit anchor of replica-1 in the store: the anchor's signature does not match") {
				t.Errorf("exit %d: %s", code, errOut)
			}
		})
	}
	t.Run("anchor deleted, chain left out", func(t *testing.T) {
		ac := anchored(t)
		ac.raw.HDel(context.Background(), anchorsKey, "replica-1")
		code, _, errOut := ac.verify(ac.chains[0])
		if code != 1 || !strings.Contains(errOut, "replica replica-1 has no anchor in the store, but the anchors of replica-0 name it: its anchor was deleted") ||
			!strings.Contains(errOut, "no chain was given for replica-1 (its anchor deleted)") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("anchor deleted, chain given", func(t *testing.T) {
		ac := anchored(t)
		ac.raw.HDel(context.Background(), anchorsKey, "replica-1")
		code, _, errOut := ac.verify(ac.chains[:]...)
		if code != 1 || !strings.Contains(errOut, "replica-1.log: replica replica-1 has no valid anchor in the store") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("chain left out", func(t *testing.T) {
		ac := anchored(t)
		code, _, errOut := ac.verify(ac.chains[1])
		if code != 1 || errOut != "pysandbox: audit verify: no chain was given for replica-0 (anchored at seq 5)\n" {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("chain cut short", func(t *testing.T) {
		ac := anchored(t)
		shorter(t, ac)
		code, _, errOut := ac.verify(ac.chains[:]...)
		if code != 1 || !strings.Contains(errOut, "replica-1.log (replica replica-1, anchored at seq 6): ") || !strings.Contains(errOut, "the chain ends at seq 4, but the expected head is seq 6: records were cut from its end") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("front cut", func(t *testing.T) {
		ac := anchored(t)
		writeFile(t, ac.chains[0], lines(t, ac.chains[0])[1:])
		code, _, errOut := ac.verify(ac.chains[:]...)
		// Its start record went with the cut: it is the chain of no
		// replica now, and replica-0's is missing.
		if code != 1 || !strings.Contains(errOut, "replica-0.log:1 (seq 2): the chain starts at seq 2") || !strings.Contains(errOut, "no chain was given for replica-0 (anchored at seq 5)") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
}
