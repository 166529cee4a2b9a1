package tools

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
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
	cp   *callProgress // the call's heartbeat, told what happens; nil without one
}

func newNotifier(ctx context.Context, req *mcp.CallToolRequest) *notifier {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	return &notifier{ctx: ctx, req: req, tok: req.Params.GetProgressToken(), sess: req.Session, cp: progressOf(ctx)}
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

// progressFunc sends the installer's lines, or is nil without a token.
func (nt *notifier) progressFunc() func(string) {
	if nt == nil || nt.tok == nil {
		return nil
	}
	if cp := nt.cp; cp != nil {
		return func(line string) {
			cp.setPhase(line)
			nt.progress(line)
		}
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
	if nt.cp != nil {
		nt.cp.streams.Store(true)
	}
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
	if cp := lv.nt.cp; cp != nil {
		cp.outBytes.Add(int64(len(p)))
		cp.outLines.Add(int64(bytes.Count(p, []byte{'\n'})))
	}
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

// Heartbeat: a call that carries a progress token hears from the server
// at least every heartbeatEvery while it runs, whatever its code does. The
// TypeScript SDK's clients give up on a request after 60 s by default and
// wait longer only when progress resets that timeout, so a run that is
// silent for a minute (or an install, or a wait for an operator) would be
// abandoned. When nothing else (live output, the installer's lines, the
// operator wait's notices) went out for that long, a progress
// notification says what is known: the time so far, the installer's last
// line, the output so far. A call that goes on printing sends nothing
// more. A variable so that tests and the benchmark can change it; zero
// turns the heartbeat off.
var heartbeatEvery = 5 * time.Second

// callProgress is what the heartbeat knows of one tools/call with a
// progress token; the call's context carries it, for the notifier.
type callProgress struct {
	tool  string
	tok   any
	start time.Time

	sendMu sync.Mutex // held while a notification is numbered and sent
	mu     sync.Mutex
	n      float64
	last   time.Time // when a progress notification last went out
	phase  string    // the installer's last line
	at     time.Duration

	streams            atomic.Bool // the call streams a run's output
	outBytes, outLines atomic.Int64
}

type callProgressKey struct{}

// progressOf is the call's callProgress, nil without a heartbeat.
func progressOf(ctx context.Context) *callProgress {
	cp, _ := ctx.Value(callProgressKey{}).(*callProgress)
	return cp
}

// heartbeat is receiving middleware: it keeps a tools/call with a progress
// token alive until its handler returns (before its result is sent).
func heartbeat(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		ctr, ok := req.(*mcp.CallToolRequest)
		every := heartbeatEvery
		if method != "tools/call" || !ok || ctr.Params == nil || ctr.Session == nil || every <= 0 {
			return next(ctx, method, req)
		}
		tok := ctr.Params.GetProgressToken()
		if tok == nil {
			return next(ctx, method, req)
		}
		now := time.Now()
		cp := &callProgress{tool: ctr.Params.Name, tok: tok, start: now, last: now}
		ctx = context.WithValue(ctx, callProgressKey{}, cp)
		done, stopped := make(chan struct{}), make(chan struct{})
		go cp.beat(ctx, ctr.Session, every, done, stopped)
		defer func() {
			close(done)
			<-stopped
		}()
		return next(ctx, method, req)
	}
}

// beat sends a notification whenever the call has been quiet for every.
func (cp *callProgress) beat(ctx context.Context, ss *mcp.ServerSession, every time.Duration, done, stopped chan struct{}) {
	defer close(stopped)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cp.mu.Lock()
		wait := every - time.Since(cp.last)
		cp.mu.Unlock()
		if wait <= 0 {
			// Progress is numbered by numberProgress.
			ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: cp.tok, Message: cp.status()})
			wait = every
		}
		t.Reset(wait)
	}
}

// status is the heartbeat's message.
func (cp *callProgress) status() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s still working after %v", cp.tool, time.Since(cp.start).Round(time.Second))
	if cp.phase != "" {
		fmt.Fprintf(&b, "; the installer's last line (at %v): %s", cp.at.Round(time.Second), cp.phase)
	}
	if cp.streams.Load() {
		fmt.Fprintf(&b, "; output so far: %d bytes, %d lines", cp.outBytes.Load(), cp.outLines.Load())
	}
	return b.String()
}

func (cp *callProgress) setPhase(line string) {
	cp.mu.Lock()
	cp.phase, cp.at = line, time.Since(cp.start)
	cp.mu.Unlock()
}

// numberProgress is sending middleware: every progress notification sent
// for a call with a heartbeat (live output, installer lines, the
// governor's operator wait, the heartbeat itself) is numbered in one
// increasing sequence, in the order they go out, and counts as the call
// being heard from.
func numberProgress(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		cp := progressOf(ctx)
		if cp == nil || method != "notifications/progress" {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*mcp.ProgressNotificationParams)
		if !ok || p == nil {
			return next(ctx, method, req)
		}
		cp.sendMu.Lock()
		defer cp.sendMu.Unlock()
		cp.mu.Lock()
		cp.n++
		p.Progress, cp.last = cp.n, time.Now()
		cp.mu.Unlock()
		return next(ctx, method, req)
	}
}
