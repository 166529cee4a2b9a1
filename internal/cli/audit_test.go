package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/audit"
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
