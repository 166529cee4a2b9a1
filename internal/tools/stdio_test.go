package tools

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
)

// stdioPeer drives a real server over the stdio transport with raw lines.
type stdioPeer struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan string
	done  chan error
}

// guard bounds every wait: ten times anything here takes, so that only a
// hang fails on it.
const guard = 60 * time.Second

func startStdio(t *testing.T, limit int64) *stdioPeer {
	t.Helper()
	srv := newServer(t, nil, nil)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &stdioPeer{t: t, in: inW, lines: make(chan string, 1024), done: make(chan error, 1)}
	go func() {
		err := srv.Run(context.Background(), NewStdioTransport(inR, outW, limit))
		outW.Close()
		p.done <- err
	}()
	go func() {
		r := bufio.NewReaderSize(outR, 1<<20)
		for {
			l, err := r.ReadString('\n')
			if l != "" {
				p.lines <- l
			}
			if err != nil {
				close(p.lines)
				return
			}
		}
	}()
	t.Cleanup(func() { inW.Close() })
	p.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n")
	p.await(`"init"`)
	return p
}

// send writes raw bytes without waiting for the server to read them.
func (p *stdioPeer) send(s string) {
	go io.WriteString(p.in, s)
}

// wireMsg is one message the server wrote.
type wireMsg struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Method string `json:"method"`
	raw    string
}

// await reads messages until the answer to id (raw JSON), and returns it
// with the answers seen before it. The server ending first fails the test.
func (p *stdioPeer) await(id string) (wireMsg, []wireMsg) {
	p.t.Helper()
	var before []wireMsg
	timeout := time.After(guard)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("the server ended (%v) before answering %s; it wrote %d messages", <-p.done, id, len(before))
			}
			var m wireMsg
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				p.t.Fatalf("the server wrote a line that is not JSON: %.200q", l)
			}
			m.raw = l
			if m.Method != "" {
				continue // notifications
			}
			if string(m.ID) == id {
				return m, before
			}
			before = append(before, m)
		case <-timeout:
			p.t.Fatalf("no answer to %s within %v", id, guard)
		}
	}
}

// TestStdioMalformed: every message that used to end the SDK's stdio loop,
// or to leave its sender waiting forever, gets an answer (or, when it
// needs none, is passed over), and the server goes on serving: after each,
// a ping is answered, and at the end a run works.
func TestStdioMalformed(t *testing.T) {
	const limit = 256 << 10
	pad := func(n int) string { return strings.Repeat("a", n) }
	// exact is a ping of exactly limit bytes.
	exact := `{"jsonrpc":"2.0","id":"edge","method":"ping","params":{"pad":"` + "%s" + `"}}`
	exact = fmt.Sprintf(exact, pad(limit-len(exact)+2))
	for _, tc := range []struct {
		name, line string
		id         string // the answer's id as JSON; "" when the message needs no answer
		noID       bool   // the answer has no id (none could be found)
		code       int64  // the JSON-RPC error's code; 0 for a result
		msg        string // in the error's message
	}{
		{name: "over the limit, id last (as the TypeScript SDK writes it)", line: `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"run_python","arguments":{"code":"` + pad(3*limit) + `"}},"id":"big"}`,
			id: `"big"`, code: -32600, msg: fmt.Sprintf("at most %d bytes", limit)},
		{name: "over the limit, id first", line: `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"` + pad(limit) + `"}}}`,
			id: `41`, code: -32600, msg: "message too large"},
		{name: "over the limit, a notification (ids in nested objects only)", line: `{"jsonrpc":"2.0","method":"x","params":{"id":5,"a":[{"id":6}],"s":"` + pad(limit) + `"}}`},
		{name: "over the limit by one byte", line: exact[:len(exact)-3] + `a"}}`, id: `"edge"`, code: -32600, msg: "message too large"},
		{name: "at the limit", line: exact, id: `"edge"`},
		{name: "over the limit, not JSON", line: pad(2 * limit), noID: true, code: -32600, msg: "message too large"},
		{name: "a client's response over the limit", line: `{"jsonrpc":"2.0","id":77,"result":{"x":"` + pad(limit) + `"}}`},
		{name: "trailing spaces", line: `{"jsonrpc":"2.0","id":"ts","method":"ping"}   `, id: `"ts"`},
		{name: "trailing tab before CRLF", line: `{"jsonrpc":"2.0","id":"tab","method":"ping"}` + "\t\r", id: `"tab"`},
		{name: "CRLF", line: `{"jsonrpc":"2.0","id":"crlf","method":"ping"}` + "\r", id: `"crlf"`},
		{name: "leading whitespace", line: " \t" + `{"jsonrpc":"2.0","id":"lead","method":"ping"}`, id: `"lead"`},
		{name: "byte order mark", line: "\ufeff" + `{"jsonrpc":"2.0","id":"bom","method":"ping"}`, id: `"bom"`},
		{name: "empty line", line: ""},
		{name: "whitespace only", line: " \t \r"},
		{name: "not JSON (cut short)", line: `{"jsonrpc":"2.0","id":7,"method":"pi`, id: `7`, code: -32700, msg: "not one JSON value"},
		{name: "two messages on a line", line: `{"jsonrpc":"2.0","id":"one","method":"ping"} {"jsonrpc":"2.0","id":"two","method":"ping"}`, id: `"two"`, code: -32700},
		{name: "two messages separated by a lone CR", line: `{"jsonrpc":"2.0","id":"one","method":"ping"}` + "\r" + `{"jsonrpc":"2.0","id":"cr","method":"ping"}`, id: `"cr"`, code: -32700},
		{name: "invalid UTF-8 in a string", line: "{\"jsonrpc\":\"2.0\",\"id\":\"u8\",\"method\":\"tools/call\",\"params\":{\"name\":\"validate_script\",\"arguments\":{\"code\":\"x = '\xff'\"}}}",
			id: `"u8"`, code: -32700, msg: "not valid UTF-8"},
		{name: "invalid UTF-8 in the id", line: "{\"jsonrpc\":\"2.0\",\"id\":\"u\xff\",\"method\":\"ping\"}", noID: true, code: -32700, msg: "not valid UTF-8"},
		{name: "a batch", line: `[{"jsonrpc":"2.0","id":"b1","method":"ping"}]`, noID: true, code: -32600, msg: "batches are not supported"},
		{name: "an empty batch", line: `[]`, noID: true, code: -32600, msg: "batches"},
		{name: "a number", line: `5`, noID: true, code: -32600},
		{name: "null", line: `null`, noID: true, code: -32600},
		{name: "jsonrpc 1.0", line: `{"jsonrpc":"1.0","id":"v1","method":"ping"}`, id: `"v1"`, code: -32600, msg: "version"},
		{name: "no jsonrpc member", line: `{"id":"nov","method":"ping"}`, id: `"nov"`, code: -32600},
		{name: "method not a string", line: `{"jsonrpc":"2.0","id":"m5","method":5}`, id: `"m5"`, code: -32600},
		{name: "id null", line: `{"jsonrpc":"2.0","id":null,"method":"ping"}`, noID: true, code: -32600, msg: "id is null"},
		{name: "id 1.5", line: `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, id: `1.5`, code: -32600, msg: "integer"},
		{name: "id 2^63", line: `{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}`, id: `9223372036854775808`, code: -32600, msg: "integer"},
		{name: "id 1e400", line: `{"jsonrpc":"2.0","id":1e400,"method":"ping"}`, id: `1e400`, code: -32600},
		{name: "id of 300 digits", line: `{"jsonrpc":"2.0","id":` + strings.Repeat("9", 300) + `,"method":"ping"}`, noID: true, code: -32600, msg: "longer than"},
		{name: "id 2^53", line: `{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`, id: `9007199254740992`},
		{name: "id 1.0", line: `{"jsonrpc":"2.0","id":1.0,"method":"ping"}`, id: `1`},
		{name: "id an object", line: `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, noID: true, code: -32600},
		{name: "duplicate ids: the last one counts, as in the SDK", line: `{"jsonrpc":"2.0","id":"first","id":"last","method":"ping"}`, id: `"last"`},
		{name: "nesting deeper than JSON parsers go", line: strings.Repeat("[", 20000) + strings.Repeat("]", 20000), noID: true, code: -32700},
		{name: "nesting deeper than the SDK takes, in params", line: `{"jsonrpc":"2.0","id":"deep","method":"ping","params":{"x":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}}`,
			id: `"deep"`, code: -32600, msg: "depth"},
		{name: "a huge number in the arguments", line: `{"jsonrpc":"2.0","id":"num","method":"tools/call","params":{"name":"run_python","arguments":{"code":"1","timeout_seconds":1e400}}}`, id: `"num"`},
		{name: "a response with an unknown id", line: `{"jsonrpc":"2.0","id":999,"result":{}}`},
		{name: "an error response with id null", line: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`},
		{name: "a response that is not valid", line: `{"jsonrpc":"2.0","id":5,"result":{}` + "\xff}"},
		{name: "a notification of an unknown method", line: `{"jsonrpc":"2.0","method":"notifications/nonsense"}`},
		{name: "a request method sent as a notification", line: `{"jsonrpc":"2.0","method":"tools/list"}`},
		{name: "an unknown method", line: `{"jsonrpc":"2.0","id":"unk","method":"no/such"}`, id: `"unk"`, code: -32601},
		{name: "params of the wrong type", line: `{"jsonrpc":"2.0","id":"p5","method":"tools/call","params":5}`, id: `"p5"`, code: -32602},
		{name: "params null", line: `{"jsonrpc":"2.0","id":"pn","method":"tools/call","params":null}`, id: `"pn"`, code: -32600},
		{name: "arguments of the wrong type", line: `{"jsonrpc":"2.0","id":"aw","method":"tools/call","params":{"name":"run_python","arguments":[]}}`, id: `"aw"`},
		{name: "arguments null", line: `{"jsonrpc":"2.0","id":"an","method":"tools/call","params":{"name":"run_python","arguments":null}}`, id: `"an"`},
		{name: "a progress token that is an object", line: `{"jsonrpc":"2.0","id":"tok","method":"tools/call","params":{"name":"run_python","arguments":{"code":"1"},"_meta":{"progressToken":{}}}}`, id: `"tok"`},
		{name: "cancelled with params of the wrong type", line: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}`},
		{name: "cancelled with an object id", line: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}`},
		{name: "initialize again", line: `{"jsonrpc":"2.0","id":"again","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, id: `"again"`, code: 0, msg: "duplicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startStdio(t, limit)
			p.send(tc.line + "\n" + `{"jsonrpc":"2.0","id":"probe","method":"ping"}` + "\n")
			_, before := p.await(`"probe"`)
			if tc.id == "" && !tc.noID {
				if len(before) > 0 {
					t.Fatalf("answered a message that needs no answer: %.300s", before[0].raw)
				}
				return
			}
			var m wireMsg
			if tc.noID {
				if len(before) != 1 || before[0].ID != nil {
					t.Fatalf("want one answer without an id before the probe's; got %d: %v", len(before), before)
				}
				m = before[0]
			} else if m = find(before, tc.id); m.raw == "" {
				m, _ = p.await(tc.id) // a tool call may answer after the ping
			}
			switch {
			case tc.code == 0 && tc.msg == "" && m.Error != nil:
				t.Fatalf("want a result, got %.300s", m.raw)
			case (tc.code != 0 || tc.msg != "") && (m.Error == nil || m.Error.Code != tc.code || !strings.Contains(m.Error.Message, tc.msg)):
				t.Fatalf("want error %d %q, got %.300s", tc.code, tc.msg, m.raw)
			}
		})
	}
}

func find(ms []wireMsg, id string) wireMsg {
	for _, m := range ms {
		if string(m.ID) == id {
			return m
		}
	}
	return wireMsg{}
}

// TestStdioSurvivesAll: one server takes every malformed message above in
// a row and still runs code.
func TestStdioSurvivesAll(t *testing.T) {
	p := startStdio(t, 64<<10)
	bad := []string{
		strings.Repeat("x", 1<<20),
		`{"jsonrpc":"2.0","id":1,"method":"ping"}  `,
		"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\",\"method\":\"ping\"}",
		`{"jsonrpc":"2.0","id":null,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1e400,"method":"ping"}`,
		strings.Repeat("{", 100000),
		`[{"jsonrpc":"2.0","id":2,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":3,"result":{}}`,
		`{"jsonrpc":"2.0","method":"nope"}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"x"}`,
		`{"jsonrpc":"2.0","id":"d","id":"e","method":"ping"}`,
	}
	p.send(strings.Join(bad, "\n") + "\n" +
		`{"jsonrpc":"2.0","id":"run","method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(6*7)"}}}` + "\r\n")
	m, _ := p.await(`"run"`)
	if m.Error != nil || !strings.Contains(string(m.Result), "42") {
		t.Fatalf("the run after the malformed messages: %.300s", m.raw)
	}
}

// TestStdioEOFWithoutNewline: a last message without a line end is read
// as a whole one, and stdin's end then ends the server cleanly.
func TestStdioEOFWithoutNewline(t *testing.T) {
	srv := newServer(t, nil, nil)
	in := strings.NewReader(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\r\n" +
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"none"}}`)
	done := make(chan error, 1)
	go func() { done <- srv.Run(context.Background(), NewStdioTransport(in, io.Discard, 1<<20)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(guard):
		t.Fatal("the server did not end at EOF")
	}

	// What the SDK is handed: the last line whole, with its line end.
	pr, pw := io.Pipe()
	var out strings.Builder
	f := &lineFilter{in: bufio.NewReader(strings.NewReader("{\"jsonrpc\":\"2.0\",\"method\":\"a\"}\r\n \n{\"jsonrpc\":\"2.0\",\"method\":\"b\"} ")), sdk: pw, w: &lockedWriter{w: &out}, limit: 1 << 20}
	go f.run()
	got, err := io.ReadAll(pr)
	if err != nil || string(got) != "{\"jsonrpc\":\"2.0\",\"method\":\"a\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"b\"}\n" || out.Len() != 0 {
		t.Fatalf("the SDK got %q (%v); the client %q", got, err, out.String())
	}
}

// endless is a reader of n bytes of one JSON string, made as it is read.
type endless struct {
	head, tail string
	n          int
}

func (e *endless) Read(p []byte) (int, error) {
	if e.n <= 0 {
		if e.tail == "" {
			return 0, io.EOF
		}
		k := copy(p, e.tail)
		e.tail = e.tail[k:]
		return k, nil
	}
	if e.head != "" {
		k := copy(p, e.head)
		e.head = e.head[k:]
		return k, nil
	}
	k := min(len(p), e.n)
	for i := range k {
		p[i] = 'a'
	}
	e.n -= k
	return k, nil
}

// TestStdioOversizeMemory: a 256 MiB line costs the filter no more memory
// than its limit: it is dropped as it streams past, and its id (at its
// end) still reaches the error.
func TestStdioOversizeMemory(t *testing.T) {
	const limit = 1 << 20
	in := &endless{head: `{"jsonrpc":"2.0","method":"tools/call","params":{"code":"`, n: 256 << 20, tail: `"},"id":"huge"}` + "\n"}
	pr, pw := io.Pipe()
	var out strings.Builder
	f := &lineFilter{in: bufio.NewReaderSize(in, 64<<10), sdk: pw, w: &lockedWriter{w: &out}, limit: limit}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	go f.run()
	got, _ := io.ReadAll(pr)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*limit {
		t.Errorf("the filter allocated %d bytes for a 256 MiB line under a %d-byte limit", alloc, limit)
	}
	if len(got) != 0 || !strings.Contains(out.String(), `"id":"huge"`) || !strings.Contains(out.String(), "message too large") {
		t.Fatalf("the SDK got %d bytes; the client %q", len(got), out.String())
	}
}

// TestMsgScan: what the scanner finds in a message it reads a byte at a
// time, however the message is cut into reads.
func TestMsgScan(t *testing.T) {
	for _, tc := range []struct {
		in, id   string
		response bool
	}{
		{`{"jsonrpc":"2.0","id":"a","method":"x"}`, `"a"`, false},
		{`{"method":"x","params":{"id":1,"s":"\"id\":2"},"id" : -3 }`, `-3`, false},
		{`{"id":"a,b}","result":{}}`, `"a,b}"`, true},
		{`{"id":"esc\"aped","error":{"id":9}}`, `"esc\"aped"`, true},
		{`{"id":[1],"method":"x"}`, ``, false},
		{`{"id":1,"id":null}`, ``, false},
		{`["id",1]`, ``, false},
		{`{"ID":1}`, ``, false},
		// Many escapes, and many short strings before one far escape:
		// each was a search to the end of the line (quadratic, hours for a
		// 24 MiB line); now one pass (the test's time is not asserted,
		// but the old scan made it run for minutes).
		{`{"method":"x","params":{"s":"` + strings.Repeat(`\n`, 2<<20) + `"},"id":7}`, `7`, false},
		{`{"method":"x","params":[` + strings.Repeat(`"a",`, 1<<20) + `"\n"],"id":8}`, `8`, false},
	} {
		for _, step := range []int{1, 3, len(tc.in)} {
			s := &msgScan{}
			for i := 0; i < len(tc.in); i += step {
				s.feed([]byte(tc.in[i:min(i+step, len(tc.in))]))
			}
			if string(s.id) != tc.id || s.response() != tc.response {
				t.Errorf("%s (reads of %d): id %s response %v", tc.in, step, s.id, s.response())
			}
		}
	}
}
