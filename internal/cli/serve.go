package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/tools"
)

func serve(args []string, stderr io.Writer) error {
	fs, o := newFlagSet("serve", "serve [--http ADDR] [flags]", stderr)
	httpAddr := fs.String("http", "", "serve MCP over streamable HTTP on this loopback address (e.g. 127.0.0.1:8080) instead of stdio")
	maxSessions := fs.Int("max-sessions", 8, "sessions open at once")
	sessionTTL := duration(10 * time.Minute)
	fs.Var(&sessionTTL, "session-ttl", "idle time after which a session expires, when create_session names none")
	maxSessionTTL := duration(24 * time.Hour)
	fs.Var(&maxSessionTTL, "max-session-ttl", "largest ttl_seconds create_session may ask for")
	sessionsMemory := size(4 << 30)
	fs.Var(&sessionsMemory, "sessions-memory", "memory budget of all sessions together (each may use --memory)")
	maxUpload := size(16 << 20)
	fs.Var(&maxUpload, "max-upload", "largest file upload_file accepts")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())}
	}
	if *httpAddr != "" {
		if err := checkLoopback(*httpAddr); err != nil {
			return usageError{err}
		}
	}
	log, err := o.logger(stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	eng, release, err := o.engine(ctx, log)
	if err != nil {
		return err
	}
	defer release()
	// Measure the posture before taking any request: a server whose
	// sandbox does not work refuses to start instead of running code
	// with less isolation than it claims.
	posture := eng.Measure(ctx, interp.Discover(ctx))
	if !posture.Usable() {
		return fmt.Errorf("the %s sandbox does not work here:\n  - %s\nrun 'pysandbox check' for the full report", posture.Backend, strings.Join(posture.Problems, "\n  - "))
	}
	if posture.Posture != "sandboxed" {
		log.Warn("UNSANDBOXED: --sandbox none runs code directly on this machine with the server's privileges")
	}
	for _, p := range posture.Problems {
		log.Warn("sandbox", "problem", p)
	}
	if *maxSessions < 1 || sessionTTL <= 0 || maxSessionTTL < sessionTTL || maxUpload < 1 {
		return usageError{fmt.Errorf("--max-sessions must be at least 1, --session-ttl positive and at most --max-session-ttl, --max-upload positive")}
	}
	sessions := eng.NewSessions(engine.SessionConfig{
		MaxSessions:  *maxSessions,
		DefaultTTL:   time.Duration(sessionTTL),
		MaxTTL:       time.Duration(maxSessionTTL),
		MemoryBudget: int64(sessionsMemory),
	})
	// Every session's processes, cgroups and files go when the server does.
	defer sessions.Shutdown()
	srv := tools.NewServer(tools.Options{Engine: eng, Posture: posture, Sessions: sessions, MaxUploadBytes: int64(maxUpload), Logger: log})
	if *httpAddr == "" {
		log.Info("serving MCP on stdio", "backend", posture.Backend, "posture", posture.Posture, "python", posture.Python.Version)
		// Run returns nil on a clean EOF from the client.
		err := srv.Run(ctx, tools.StdioTransport(os.Stdin, os.Stdout))
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"status": "ok", "backend": posture.Backend, "posture": posture.Posture})
	})
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving MCP over HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "backend", posture.Backend, "posture", posture.Posture)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// checkLoopback refuses any address that other machines could reach:
// there is no authentication yet, and anyone who can reach the port can
// run code.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http %q: want HOST:PORT such as 127.0.0.1:8080", addr)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--http %q: refusing a non-loopback address, because this server has no authentication yet and anyone who can reach it could run code; listen on 127.0.0.1 (or ::1) and put an authenticating proxy in front", addr)
	}
	return nil
}
