package govern

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// maxAuditCode is the largest code recorded whole: the tools' own cap on
// code, so all code that can run is in the log.
const maxAuditCode = 1 << 20

// maxAuditValue is the largest argument recorded verbatim, apart from the
// code; larger ones (inputs data, file contents) are recorded as their
// size and SHA-256, which still proves what was sent.
const maxAuditValue = 64 << 10

// maxAuditArgs bounds what a record keeps of a call's arguments besides
// its code; larger values are digested.
const maxAuditArgs = 256 << 10

// AuditArgs returns the arguments as recorded: compact JSON with the code
// in full and bulky values replaced by digests, and the code's SHA-256.
func AuditArgs(tool string, raw json.RawMessage) (json.RawMessage, string) {
	if len(raw) == 0 {
		return nil, ""
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil {
		return digestJSON(raw), ""
	}
	codeSum := ""
	for k, v := range args {
		if k == "code" {
			var code string
			if json.Unmarshal(v, &code) == nil {
				sum := sha256.Sum256([]byte(code))
				codeSum = hex.EncodeToString(sum[:])
				if len(code) <= maxAuditCode {
					continue
				}
			}
		}
		if len(v) > maxAuditValue || (tool == "upload_file" && (k == "content" || k == "content_base64")) {
			args[k] = digestJSON(v)
		}
	}
	// The rest together is bounded too: many values just under the bound
	// would make one record (and one line) of any size.
	total := 0
	for k, v := range args {
		if k != "code" {
			total += len(v)
		}
	}
	for k, v := range args {
		if total <= maxAuditArgs {
			break
		}
		if k != "code" && len(v) > 256 {
			total -= len(v)
			args[k] = digestJSON(v)
		}
	}
	b, err := PlainJSON(args, "")
	if err != nil {
		return digestJSON(raw), codeSum
	}
	return b, codeSum
}

// PlainJSON is v as JSON without HTML escapes (json.Marshal would write
// every <, > and & of code or output as six bytes), indented by indent
// when it is not "", without a final newline.
func PlainJSON(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func digestJSON(v []byte) json.RawMessage {
	sum := sha256.Sum256(v)
	b, _ := json.Marshal(map[string]any{"omitted_bytes": len(v), "sha256": hex.EncodeToString(sum[:])})
	return b
}
