// Package audit keeps a tamper-evident, append-only log of MCP tool calls
// as JSON lines.
//
// Each line is one Record followed by its own hash:
//
//	{"seq":1,"time":"...","event":"call",...,"prev":""},"hash":"<hex sha256>"}
//
// where the hash is the SHA-256 of the exact bytes of the object without
// the hash member, and each record's prev is the hash of the record before
// it. An edited line fails its own hash; a deleted, duplicated or
// reordered line breaks the seq and prev chain at the next line.
//
// The chain has no secret: whoever can write the file can also recompute
// every hash after an edit. What it guarantees is that the log cannot be
// changed without rewriting everything after the change, so a head hash
// (Writer.Head, or the one Verify reports) kept somewhere else pins the
// whole history before it.
package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Record is one line of the log. The JSON field names and their order are
// a contract: verification hashes the exact bytes.
type Record struct {
	Seq             int64             `json:"seq"`                // 1-based, continues across rotation
	Time            time.Time         `json:"time"`               // UTC, RFC 3339 with nanoseconds
	Event           string            `json:"event"`              // "call", "start", "rotate"
	Identity        string            `json:"identity,omitempty"` // token name, or connection id
	Tool            string            `json:"tool,omitempty"`
	CallID          string            `json:"call_id,omitempty"`     // ties a call to its connections
	Arguments       json.RawMessage   `json:"arguments,omitempty"`   // as sent by the client (compacted)
	CodeSHA256      string            `json:"code_sha256,omitempty"` // hex SHA-256 of the code run
	Decision        string            `json:"decision,omitempty"`    // allow, deny, rate_limited, approval_requested, approved, declined, ...
	Reason          string            `json:"reason,omitempty"`
	Status          string            `json:"status,omitempty"` // run status: success, error, timeout, memory_limit, ...
	ExitCode        *int              `json:"exit_code,omitempty"`
	DurationMS      int64             `json:"duration_ms"`
	PeakMemoryBytes int64             `json:"peak_memory_bytes,omitempty"`
	CPUTimeMS       int64             `json:"cpu_time_ms,omitempty"`
	LimitsHit       []string          `json:"limits_hit,omitempty"`
	Error           string            `json:"error,omitempty"`    // the isError text the client saw, capped at MaxErrorBytes
	Detail          map[string]string `json:"detail,omitempty"`   // free-form: server version on "start", previous file on "rotate"
	Net             *Connection       `json:"net,omitempty"`      // on "connect": the connection
	Upstream        *UpstreamCall     `json:"upstream,omitempty"` // on "upstream_call": the call
	Prev            string            `json:"prev"`               // hash of the previous record; "" for the first of a chain
}

// Events.
const (
	EventCall   = "call"
	EventStart  = "start"
	EventRotate = "rotate"
	// EventPolicy records a policy replacing the one in force (serve
	// reloads its policy file on SIGHUP); Detail holds its digest.
	EventPolicy = "policy"
	// EventConnect records one connection a run asked the network proxy
	// for, allowed or not; CallID names the call it belongs to.
	EventConnect = "connect"
	// EventUpstream records one call code in a run made to an upstream
	// MCP server's tool (Tool is SERVER.TOOL), allowed or not; CallID
	// names the run_python call it was made in.
	EventUpstream = "upstream_call"
	// EventPython records the install or removal of a managed
	// interpreter (Detail: action, version, url, sha256, bytes); Decision
	// is its outcome: installed, failed, refused (the archive or its
	// digest), removed. Its connections have "connect" records of their
	// own, with Tool "python-download".
	EventPython = "python"
	// EventSession records what happened to a session's snapshot:
	// Decision is pause, checkpoint, resume, expire, refuse (a resume by
	// someone else, or a snapshot that is not genuine) or fail; Identity
	// is who asked, Detail names the session, its owner and the sizes.
	EventSession = "session"
)

// UpstreamCall is what an "upstream_call" record says about the call.
type UpstreamCall struct {
	Server      string `json:"server"`
	Tool        string `json:"tool"`
	Session     string `json:"session,omitempty"`
	ArgsBytes   int    `json:"args_bytes"`
	ResultBytes int64  `json:"result_bytes"`
	// Unrecorded, on the summary a call's refusals end with past their
	// cap, counts by decision the refusals without a record of their own.
	Unrecorded map[string]int `json:"unrecorded,omitempty"`
}

// Connection is what a "connect" record says about a connection.
type Connection struct {
	Method   string `json:"method"` // CONNECT, or the plain HTTP method
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Address  string `json:"address,omitempty"` // the address connected to
	Session  string `json:"session,omitempty"`
	BytesIn  int64  `json:"bytes_in"`
	BytesOut int64  `json:"bytes_out"`
	// Unrecorded, on the summary a call's refusals end with past their
	// cap, counts by decision the refusals that have no record of their
	// own.
	Unrecorded map[string]int `json:"unrecorded,omitempty"`
}

// MaxErrorBytes caps Record.Error: the client already saw the full text,
// and a hostile run can make it as large as its output.
const MaxErrorBytes = 4 << 10

// MaxLineBytes is the longest line Verify, Open and Tail accept. Code is
// capped well below this (1 MiB), but JSON escaping can inflate it up to
// six times, and arguments hold more than the code.
const MaxLineBytes = 64 << 20

// maxLineBytes is MaxLineBytes, lowered by tests.
var maxLineBytes = MaxLineBytes

// hashSep and hashLen frame the hash member at the end of a line.
const (
	hashSep = `,"hash":"`
	hashLen = sha256.Size * 2
)

// encodeLine returns the line for r, newline included, and its hash.
func encodeLine(r *Record) (line []byte, hash string, err error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Code is full of <, > and &: keep them readable for grep.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, "", err
	}
	body := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	sum := sha256.Sum256(body)
	hash = hex.EncodeToString(sum[:])
	line = make([]byte, 0, len(body)+len(hashSep)+hashLen+3)
	line = append(line, body[:len(body)-1]...) // drop the closing brace
	line = append(line, hashSep...)
	line = append(line, hash...)
	line = append(line, "\"}\n"...)
	return line, hash, nil
}

// errEdited is the own-hash mismatch of a well-framed line.
var errEdited = errors.New("record edited: its hash does not match its content")

// parseLine splits a complete line (newline stripped) into its record and
// hash, checking the hash. On errEdited the record is still returned, when
// it decodes, so the caller can name its seq.
func parseLine(line []byte) (*Record, string, error) {
	n := len(line)
	if n < len(hashSep)+hashLen+2 || line[0] != '{' || string(line[n-2:]) != `"}` ||
		string(line[n-2-hashLen-len(hashSep):n-2-hashLen]) != hashSep {
		return nil, "", errors.New(`malformed line: not a JSON object ending in ,"hash":"<sha256>"}`)
	}
	hash := string(line[n-2-hashLen : n-2])
	if !isLowerHex(hash) {
		return nil, "", errors.New("malformed line: the hash is not 64 lowercase hex digits")
	}
	body := make([]byte, 0, n-len(hashSep)-hashLen-1)
	body = append(body, line[:n-2-hashLen-len(hashSep)]...)
	body = append(body, '}')
	var r Record
	decErr := json.Unmarshal(body, &r)
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != hash {
		if decErr != nil {
			return nil, hash, errEdited
		}
		return &r, hash, errEdited
	}
	if decErr != nil {
		return nil, hash, fmt.Errorf("malformed record: %v", decErr)
	}
	if r.Seq < 1 {
		return nil, hash, fmt.Errorf("malformed record: seq %d, want 1 or more", r.Seq)
	}
	if r.Prev != "" && !isLowerHex(r.Prev) {
		return nil, hash, errors.New("malformed record: prev is not 64 lowercase hex digits")
	}
	return &r, hash, nil
}

func isLowerHex(s string) bool {
	if len(s) != hashLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// capError shortens s to at most MaxErrorBytes, on a rune boundary, saying
// that it did.
func capError(s string) string {
	if len(s) <= MaxErrorBytes {
		return s
	}
	const mark = " [truncated]"
	cut := MaxErrorBytes - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
