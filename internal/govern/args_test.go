package govern

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestAuditArgs(t *testing.T) {
	code := "print('x')"
	args, sum := AuditArgs("upload_file", json.RawMessage(`{"session_id": "s", "path": "a.txt", "content": "secret data", "code": "print('x')"}`))
	if strings.Contains(string(args), "secret data") || !strings.Contains(string(args), `"omitted_bytes":13`) || !strings.Contains(string(args), code) {
		t.Errorf("upload args %s", args)
	}
	if len(sum) != 64 {
		t.Errorf("code sum %q", sum)
	}
	big := strings.Repeat("x", maxAuditValue+1)
	args, _ = AuditArgs("run_python", json.RawMessage(`{"code": "1", "inputs": {"data": "`+big+`"}}`))
	if len(args) > 1000 || !strings.Contains(string(args), `"code":"1"`) {
		t.Errorf("big inputs are not summarised: %d bytes", len(args))
	}
	args, _ = AuditArgs("run_python", json.RawMessage(`not json`))
	if !json.Valid(args) || !strings.Contains(string(args), "omitted_bytes") {
		t.Errorf("invalid args recorded as %s", args)
	}
}

// TestAuditArgsBounded: many values just under the per-value bound are
// digested past a total, and the record keeps < and > as they are.
func TestAuditArgsBounded(t *testing.T) {
	args := map[string]string{"code": "print('<b>')"}
	for i := 0; i < 40; i++ {
		args[fmt.Sprint("k", i)] = strings.Repeat("<", maxAuditValue-100)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf) // as a client sends it: < as <
	enc.SetEscapeHTML(false)
	enc.Encode(args)
	rec, _ := AuditArgs("list_sessions", buf.Bytes())
	if len(rec) > maxAuditArgs+maxAuditValue+64<<10 || !strings.Contains(string(rec), "print('<b>')") || strings.Contains(string(rec), `\u003c`) {
		t.Errorf("the recorded arguments: %d bytes (%.200s)", len(rec), rec)
	}
}
