package tools

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// MaxRequestBytes is the largest message the server reads, on stdio as
// over HTTP (serve computes its HTTP bound the same way): the largest
// upload_file (maxUpload bytes) in base64, plus 1 MiB for the rest of the
// call. So an upload one transport takes, the other takes too.
func MaxRequestBytes(maxUpload int64) int64 { return maxUpload*4/3 + 1<<20 }

// stdioUpload is the upload limit of the server NewServers built last.
// serve builds its server before it calls StdioTransport, and a process
// serves one stdio server, so the transport learns --max-upload here
// without serve passing it.
var stdioUpload atomic.Int64

// StdioTransport is the SDK's stdio transport behind a line filter, for
// the server NewServers built (its lines bounded by MaxRequestBytes of its
// upload limit).
func StdioTransport(in io.Reader, out io.Writer) mcp.Transport {
	up := stdioUpload.Load()
	if up <= 0 {
		up = defaultMaxUpload
	}
	return NewStdioTransport(in, out, MaxRequestBytes(up))
}

// defaultMaxUpload is upload_file's limit when Options leave it zero.
const defaultMaxUpload = 16 << 20

// NewStdioTransport is StdioTransport with lines bounded by maxBytes.
//
// The SDK's IOTransport ends the whole connection, and with it a stdio
// server, on the first message it cannot take: one over its own line cap
// (16 MiB), one that is not JSON or not JSON-RPC, a batch, or JSON
// followed by anything but the line's end (trailing spaces). A client bug
// or a stray write must not take the server and every session down, so
// lines pass a filter first: it answers what the SDK would die on with a
// JSON-RPC error (carrying the request's id when it can be found) and
// hands the SDK only single, trimmed, well-formed messages within
// maxBytes, so the SDK's cap can be off.
func NewStdioTransport(in io.Reader, out io.Writer, maxBytes int64) mcp.Transport {
	if maxBytes <= 0 {
		maxBytes = MaxRequestBytes(defaultMaxUpload)
	}
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	f := &lineFilter{in: bufio.NewReaderSize(in, 64<<10), sdk: pw, w: w, limit: int(min(maxBytes, math.MaxInt32))}
	go f.run()
	return &mcp.IOTransport{Reader: pr, Writer: nopCloser{w}, MaxLineLength: -1}
}

// lineFilter copies well-formed lines from in to the SDK and answers the
// rest.
type lineFilter struct {
	in    *bufio.Reader
	sdk   *io.PipeWriter
	w     *lockedWriter
	limit int
	line  []byte // the line being read, reused
}

func (f *lineFilter) run() {
	for {
		line, over, scan, err := f.readLine()
		var ok bool
		if over {
			ok = f.refuse(scan, jsonrpc.CodeInvalidRequest, fmt.Sprintf(
				"message too large: this server reads at most %d bytes (%.1f MiB) in one message, on stdio as over HTTP (room for its largest upload_file in base64); it was read and dropped, and nothing was done",
				f.limit, float64(f.limit)/(1<<20)))
		} else {
			ok = f.pass(line)
		}
		if !ok {
			return
		}
		if err != nil {
			// io.EOF ends the session cleanly, as the SDK's own reader does.
			f.sdk.CloseWithError(err)
			return
		}
	}
}

// readLine reads one '\n'-terminated line (or what precedes EOF). A
// message longer than f.limit is not kept: it is scanned as it streams
// past, in constant memory, for what an answer needs (its id), and
// dropped.
func (f *lineFilter) readLine() (line []byte, over bool, scan *msgScan, err error) {
	if cap(f.line) > 1<<20 {
		f.line = nil // give back what the longest lines took
	}
	f.line = f.line[:0]
	for {
		chunk, rerr := f.in.ReadSlice('\n')
		switch {
		case over:
			scan.feed(chunk)
		case len(f.line)+len(chunk) > f.limit+len("\r\n"):
			over, scan = true, &msgScan{}
			scan.feed(f.line)
			scan.feed(chunk)
			f.line = nil
		default:
			f.line = append(f.line, chunk...)
		}
		if rerr == bufio.ErrBufferFull {
			continue
		}
		// The limit is on the message, not on its line's end.
		if !over && len(bytes.TrimRight(f.line, "\r\n")) > f.limit {
			over, scan = true, &msgScan{}
			scan.feed(f.line)
		}
		return f.line, over, scan, rerr
	}
}

// pass hands one line to the SDK, or answers it if the SDK would not take
// it; it says false once the SDK's side is closed.
func (f *lineFilter) pass(line []byte) bool {
	line = bytes.Trim(line, jsonSpace)
	// A byte order mark, which some Windows tools put before text, is not
	// JSON but means nothing (RFC 8259 lets a reader ignore it).
	line = bytes.TrimPrefix(line, []byte("\ufeff"))
	if len(line) == 0 {
		return true
	}
	scan := func() *msgScan {
		s := &msgScan{}
		s.feed(line)
		return s
	}
	switch {
	case !utf8.Valid(line):
		// JSON-RPC text is UTF-8; the SDK would put U+FFFD in place of the
		// bad bytes, in an id too, whose answer the client could not match.
		return f.refuse(scan(), jsonrpc.CodeParseError, "parse error: the message is not valid UTF-8")
	case !json.Valid(line):
		return f.refuse(scan(), jsonrpc.CodeParseError, "parse error: the line is not one JSON value")
	case line[0] == '[':
		// A batch. MCP has had none since 2025-06-18, and the SDK ends
		// the session on one: answer it here instead.
		return f.refuse(nil, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported; send one message per line")
	}
	msg, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		// The SDK's reason may quote the message: keep the answer short.
		return f.refuse(scan(), jsonrpc.CodeInvalidRequest, "invalid JSON-RPC message: "+strings.ToValidUTF8(engine.Head(err.Error(), 300), ""))
	}
	if req, ok := msg.(*jsonrpc.Request); ok {
		// The SDK reads a null id as none (a notification, never answered)
		// and every number as a float64 it truncates to an int64, so 1.5
		// would be answered as 1 and 2^63 as -2^63: the client would wait
		// for an answer that never comes, or get another call's. A string
		// id comes back as it went.
		if _, str := req.ID.Raw().(string); !str {
			if s := scan(); s.idSeen {
				m := badID(s.idRaw)
				if s.idRaw == nil {
					m = fmt.Sprintf("invalid request: the id is longer than %d bytes", maxIDBytes)
				}
				if m != "" {
					return f.refuse(s, jsonrpc.CodeInvalidRequest, m)
				}
			}
		}
	}
	return f.forward(line)
}

// jsonSpace is the whitespace JSON allows around a value.
const jsonSpace = " \t\r\n"

// maxSafeID is the largest integer a JSON number holds exactly as a
// double (2^53), which is how the SDK and JavaScript clients read ids.
const maxSafeID = 1 << 53

// badID says what is wrong with a request's id, as it was on the wire,
// or "" if the SDK answers it with the same id.
func badID(raw []byte) string {
	switch {
	case len(raw) == 0 || raw[0] == '"':
		return ""
	case string(raw) == "null":
		return "invalid request: the id is null; MCP requests need a string or integer id (a message without one is a notification)"
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || v != math.Trunc(v) || math.Abs(v) > maxSafeID {
		return fmt.Sprintf("invalid request: id %.40s is not a string or an integer of at most 2^53 in magnitude", raw)
	}
	return ""
}

// forward hands a line to the SDK.
func (f *lineFilter) forward(line []byte) bool {
	_, err := f.sdk.Write(append(line, '\n'))
	return err == nil
}

// refuse answers a message that does not reach the SDK as it is. A
// request gets a JSON-RPC error, with its id when scan found one, and so
// does a line nothing can be told of. A notification (a method and no id)
// gets no answer, as JSON-RPC has it: an error without an id is one the
// Go SDK's client ends its connection on. A response is never answered
// either (a client that answered our error could go on forever): if it has
// an id, the SDK gets an error response in its place, so the server's
// call it answers fails now instead of waiting.
func (f *lineFilter) refuse(scan *msgScan, code int64, msg string) bool {
	var id json.RawMessage
	if scan != nil && scan.id != nil {
		id = scan.id
	}
	switch {
	case scan != nil && scan.response():
		if id == nil || badID(id) != "" {
			return true
		}
		return f.forward(errorLine(id, code, "the client's response was refused: "+msg))
	case scan != nil && scan.method && !scan.idSeen:
		return true
	}
	f.w.Write(append(errorLine(id, code, msg), '\n'))
	return true
}

// errorLine is a JSON-RPC error response to id (raw JSON; nil when not
// known, in which case "id" is left out: the TypeScript SDK drops an
// error whose id is null, and takes one without).
func errorLine(id json.RawMessage, code int64, msg string) []byte {
	type wireError struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	}
	data, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id,omitempty"`
		Error   wireError       `json:"error"`
	}{"2.0", id, wireError{code, msg}})
	if err != nil {
		// Only an id that is not JSON fails, and scan keeps none such.
		data, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "error": wireError{code, msg}})
	}
	return data
}

// msgScan reads the top level of a JSON object a byte at a time, in
// constant memory, for what an answer to a message that cannot be parsed
// whole needs: its id (the last one, as the SDK takes the last of
// duplicate keys) and whether it has a method or is a response. Made for
// lines too long to keep, and for broken ones; what it finds in a broken
// line is a best guess.
type msgScan struct {
	depth      int
	obj        bool // the value is an object
	inStr, esc bool
	wantKey    bool   // at the top level, a key comes next
	inKey      bool   // the string being read is a top-level key
	key        []byte // that key, up to maxKey bytes
	keyLong    bool
	capture    bool   // reading the value of a top-level "id"
	val        []byte // that value as it was written, up to maxIDBytes
	valLong    bool

	idSeen         bool
	idRaw          []byte // the last id, as written (trimmed), if not too long
	id             []byte // the last id, if it is a string or a number
	method, result bool
}

const (
	maxKey     = 8
	maxIDBytes = 256
)

// response says whether the message is a response (no method; a result
// or an error).
func (s *msgScan) response() bool { return !s.method && s.result }

func (s *msgScan) feed(p []byte) {
	// The next quote and backslash at or after i, found once each and
	// kept until passed: searching afresh at every escape would cost the
	// rest of the line each time (quadratic in a line of escapes).
	nextQ, nextB := -1, -1
	next := func(at *int, c byte, i int) int {
		if *at < i {
			if k := bytes.IndexByte(p[i:], c); k >= 0 {
				*at = i + k
			} else {
				*at = len(p)
			}
		}
		return *at
	}
	for i := 0; i < len(p); i++ {
		if s.inStr && !s.esc && !s.inKey && !s.capture {
			// Inside a string nothing matters but its end: skip to the
			// next quote or backslash (most of an upload is one string;
			// IndexByte is vectorised, IndexAny is not).
			j := min(next(&nextQ, '"', i), next(&nextB, '\\', i))
			if j == len(p) {
				return
			}
			i = j
		}
		s.step(p[i])
	}
}

func (s *msgScan) step(c byte) {
	if s.capture && (s.inStr || s.depth > 1 || (c != ',' && c != '}')) {
		if len(s.val) < maxIDBytes {
			s.val = append(s.val, c)
		} else {
			s.valLong = true
		}
	}
	if s.inStr {
		switch {
		case s.esc:
			s.esc = false
			s.keyByte(c)
		case c == '\\':
			s.esc = true
			s.keyByte(c)
		case c == '"':
			s.inStr = false
			if s.inKey {
				s.inKey = false
			}
		default:
			s.keyByte(c)
		}
		return
	}
	switch c {
	case '"':
		s.inStr = true
		if s.depth == 1 && s.obj && s.wantKey {
			s.inKey, s.wantKey, s.key, s.keyLong = true, false, s.key[:0], false
		}
	case '{', '[':
		if s.depth == 0 && c == '{' {
			s.obj, s.wantKey = true, true
		}
		s.depth++
	case '}', ']':
		if s.depth == 1 && s.capture {
			s.endID()
		}
		if s.depth > 0 {
			s.depth--
		}
	case ',':
		if s.depth == 1 {
			if s.capture {
				s.endID()
			}
			s.wantKey = true
		}
	case ':':
		if s.depth == 1 && s.obj && !s.capture && !s.keyLong {
			switch string(s.key) {
			case "id":
				s.capture, s.val, s.valLong = true, s.val[:0], false
			case "method":
				s.method = true
			case "result", "error":
				s.result = true
			}
			s.key = s.key[:0]
		}
	}
}

// keyByte adds a byte to the top-level key being read.
func (s *msgScan) keyByte(c byte) {
	if !s.inKey {
		return
	}
	if len(s.key) < maxKey {
		s.key = append(s.key, c)
	} else {
		s.keyLong = true
	}
}

// endID ends the value of an "id" key.
func (s *msgScan) endID() {
	s.capture, s.idSeen = false, true
	v := bytes.Trim(s.val, jsonSpace)
	s.idRaw, s.id = nil, nil
	if s.valLong {
		return
	}
	s.idRaw = append([]byte(nil), v...)
	if len(v) > 0 && (v[0] == '"' || v[0] == '-' || v[0] >= '0' && v[0] <= '9') && json.Valid(v) && utf8.Valid(v) {
		s.id = s.idRaw
	}
}

// lockedWriter serialises whole-message writes from the SDK and from the
// filter onto one stream.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
