package tools

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMessageBytes bounds one JSON-RPC line on stdio: the largest code and
// inputs a call may carry, with room for JSON escaping.
const MaxMessageBytes = 32 << 20

// StdioTransport is the SDK's stdio transport behind a line filter. The
// SDK ends the whole session on a line that is not JSON-RPC; a client bug
// or a stray write must not take the server down, so such a line is
// answered with a JSON-RPC error and skipped, and the session goes on.
func StdioTransport(in io.Reader, out io.Writer) mcp.Transport {
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	go filterLines(in, pw, w)
	return &mcp.IOTransport{Reader: pr, Writer: nopCloser{w}}
}

// filterLines copies well-formed lines from in to pw and answers the rest.
func filterLines(in io.Reader, pw *io.PipeWriter, w *lockedWriter) {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, tooLong, err := readLine(r)
		switch {
		case tooLong:
			w.writeError(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("message larger than %d bytes was dropped", MaxMessageBytes))
		case len(bytes.TrimSpace(line)) == 0:
		case !json.Valid(line):
			w.writeError(nil, jsonrpc.CodeParseError, "parse error: the line is not JSON")
		case bytes.HasPrefix(bytes.TrimSpace(line), []byte("[")):
			// A batch. MCP has had none since 2025-06-18, and the SDK ends
			// the session on one: answer it here instead.
			w.writeError(nil, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported; send one message per line")
		default:
			if msg, derr := jsonrpc.DecodeMessage(line); derr != nil || msg == nil {
				w.writeError(requestID(line), jsonrpc.CodeInvalidRequest, "invalid JSON-RPC message")
				break
			}
			if _, werr := pw.Write(append(line, '\n')); werr != nil {
				return
			}
		}
		if err != nil {
			pw.CloseWithError(err)
			return
		}
	}
}

// readLine reads one '\n'-terminated line, discarding (and reporting) one
// that exceeds MaxMessageBytes instead of buffering it.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > MaxMessageBytes {
			tooLong, line = true, nil
		} else if !tooLong {
			line = append(line, chunk...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), tooLong, err
	}
}

// requestID recovers the id of a malformed request, so its error can be
// matched to it.
func requestID(line []byte) any {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(line, &probe) != nil || len(probe.ID) == 0 {
		return nil
	}
	var id any
	if json.Unmarshal(probe.ID, &id) != nil {
		return nil
	}
	switch id.(type) {
	case string, float64:
		return id
	}
	return nil
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

func (l *lockedWriter) writeError(id any, code int64, msg string) {
	resp := &jsonrpc.Response{Error: &jsonrpc.Error{Code: code, Message: msg}}
	if id != nil {
		if jid, err := jsonrpc.MakeID(id); err == nil {
			resp.ID = jid
		}
	}
	data, err := jsonrpc.EncodeMessage(resp)
	if err != nil {
		return
	}
	l.Write(append(data, '\n'))
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
