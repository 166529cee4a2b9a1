package tools

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// Live output: while a run is in flight, what it prints reaches the
// client as it happens, as progress notifications when the client sent a
// progress token (their message is the text), else as log notifications
// (notifications/message: stdout at level info, stderr at warning, from
// logger "stdout"/"stderr"; the SDK sends them once the client has set a
// level with logging/setLevel). The final result is still complete; this
// is a preview, so it is bounded: sent at most every liveEvery, at most
// liveChunk bytes a notification and liveTotal a run, after which one
// notice says the rest is in the result.
const (
	liveEvery = 250 * time.Millisecond
	liveChunk = 8 << 10
	liveTotal = 1 << 20
)

// notifier sends a call's progress notifications, numbered in one
// increasing sequence whoever sends them (installer and output).
type notifier struct {
	ctx  context.Context
	req  *mcp.CallToolRequest
	tok  any
	mu   sync.Mutex
	n    float64
	sess *mcp.ServerSession
}

func newNotifier(ctx context.Context, req *mcp.CallToolRequest) *notifier {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	return &notifier{ctx: ctx, req: req, tok: req.Params.GetProgressToken(), sess: req.Session}
}

// progress sends a progress notification, if the client asked for them.
func (nt *notifier) progress(msg string) {
	if nt == nil || nt.tok == nil {
		return
	}
	nt.mu.Lock()
	nt.n++
	n := nt.n
	nt.mu.Unlock()
	nt.sess.NotifyProgress(nt.ctx, &mcp.ProgressNotificationParams{ProgressToken: nt.tok, Progress: n, Message: msg})
}

// progressFunc is nt.progress, or nil without a token.
func (nt *notifier) progressFunc() func(string) {
	if nt == nil || nt.tok == nil {
		return nil
	}
	return nt.progress
}

// liveOutput streams a run's output to the client; stop sends what is
// left and ends it. Writes never block the run: past the bounds, text is
// dropped (the result keeps it).
func (nt *notifier) liveOutput() (stdout, stderr io.Writer, stop func()) {
	if nt == nil {
		return nil, nil, func() {}
	}
	lv := &live{nt: nt, done: make(chan struct{}), stopped: make(chan struct{})}
	go lv.loop()
	return liveStream{lv, "stdout"}, liveStream{lv, "stderr"}, func() {
		close(lv.done)
		<-lv.stopped
	}
}

type live struct {
	nt            *notifier
	mu            sync.Mutex
	buf           [2][]byte // stdout, stderr
	sent, dropped int
	finishing     bool // the run is over: send everything
	done, stopped chan struct{}
}

// pending says whether anything is left to send.
func (lv *live) pending() bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return len(lv.buf[0])+len(lv.buf[1]) > 0
}

type liveStream struct {
	lv   *live
	name string
}

func (s liveStream) Write(p []byte) (int, error) {
	i := 0
	if s.name == "stderr" {
		i = 1
	}
	lv := s.lv
	lv.mu.Lock()
	room := liveTotal - lv.sent - len(lv.buf[0]) - len(lv.buf[1])
	switch {
	case room <= 0:
		lv.dropped += len(p)
	case len(p) > room:
		lv.buf[i] = append(lv.buf[i], p[:room]...)
		lv.dropped += len(p) - room
	default:
		lv.buf[i] = append(lv.buf[i], p...)
	}
	lv.mu.Unlock()
	return len(p), nil
}

func (lv *live) loop() {
	defer close(lv.stopped)
	t := time.NewTicker(liveEvery)
	defer t.Stop()
	noticed := false
	for {
		select {
		case <-lv.done:
			lv.mu.Lock()
			lv.finishing = true
			lv.mu.Unlock()
			for lv.pending() {
				lv.flush(&noticed)
			}
			return
		case <-lv.nt.ctx.Done():
			return
		case <-t.C:
			lv.flush(&noticed)
		}
	}
}

// flush sends what was written since the last one, a chunk per stream.
func (lv *live) flush(noticed *bool) {
	for i, name := range []string{"stdout", "stderr"} {
		lv.mu.Lock()
		chunk := lv.buf[i]
		if len(chunk) > liveChunk {
			chunk = chunk[:liveChunk]
		}
		// A character cut at the chunk's end waits for the next flush
		// (unless the run is over); bytes that are not UTF-8 go as U+FFFD.
		if !lv.finishing {
			chunk = chunk[:len(engine.Head(string(chunk), len(chunk)))]
		}
		lv.buf[i] = append([]byte(nil), lv.buf[i][len(chunk):]...)
		lv.sent += len(chunk)
		dropped := lv.dropped
		lv.mu.Unlock()
		if len(chunk) > 0 {
			lv.send(name, strings.ToValidUTF8(string(chunk), "\ufffd"))
		}
		if dropped > 0 && !*noticed {
			*noticed = true
			lv.send("stderr", fmt.Sprintf("[pysandbox: live output stops here after %d bytes; the result has all of it]\n", liveTotal))
		}
	}
}

func (lv *live) send(stream, text string) {
	nt := lv.nt
	if nt.tok != nil {
		nt.progress(stream + ": " + text)
		return
	}
	level := "info"
	if stream == "stderr" {
		level = "warning"
	}
	// Logging is deprecated from protocol 2026-07-28 on, but the clients
	// of older versions read output this way (the SDK sends nothing to a
	// client that set no level).
	//lint:ignore SA1019 log notifications are how pre-2026-07-28 clients see live output
	nt.sess.Log(nt.ctx, &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(level), Logger: stream, Data: text})
}
