package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/sharedstate"
)

// replicaFlags are serve's flags for running as one replica of several
// (internal/cluster).
type replicaFlags struct {
	name, advertise, internalAddr, tokenFile string
	drain                                    duration
}

func (f *replicaFlags) add(fs *flag.FlagSet) {
	f.drain = duration(25 * time.Second)
	fs.Var(&f.drain, "drain-timeout", "on SIGTERM, how long runs in flight may take to finish while no new session is taken; with other replicas, paused sessions are then handed to them for up to 5s more (keep it at least 15s below the pod's terminationGracePeriodSeconds)")
	fs.StringVar(&f.name, "replica", "", "with --internal-http: this replica's name, a DNS label (default: $POD_NAME, else the host name); the ids of its sessions carry it")
	fs.StringVar(&f.advertise, "advertise", "", "with --internal-http: the address the other replicas reach this one at (default: $POD_IP)")
	fs.StringVar(&f.internalAddr, "internal-http", "", "run as one replica of several behind one address (needs --http and --store): serve the other replicas on this address (e.g. :8081; keep it inside the cluster). Requests for MCP sessions and pysandbox sessions another replica owns are served by their owner")
	fs.StringVar(&f.tokenFile, "replica-token-file", "", "with --internal-http: the token replicas authenticate to each other with (the same file for all; at least 32 characters, not readable by others)")
}

// check refuses replica flags that do not go together, given serve's
// --http and whether a shared store is named.
func (f *replicaFlags) check(httpAddr string, store bool) error {
	if f.internalAddr == "" {
		if f.tokenFile != "" || f.advertise != "" || f.name != "" {
			return usageError{errors.New("--replica, --advertise and --replica-token-file go with --internal-http")}
		}
		return nil
	}
	if httpAddr == "" || !store {
		return usageError{errors.New("--internal-http needs --http and --store (the replicas' shared store)")}
	}
	if f.tokenFile == "" {
		return usageError{errors.New("--internal-http needs --replica-token-file: the replicas' internal endpoint serves calls governance already decided, so only replicas may reach it")}
	}
	if f.advertised() == "" {
		return usageError{errors.New("--internal-http needs --advertise (or $POD_IP): where the other replicas reach this one")}
	}
	return nil
}

// advertised is where the other replicas reach this one: --advertise,
// else $POD_IP.
func (f *replicaFlags) advertised() string {
	if f.advertise != "" {
		return f.advertise
	}
	return os.Getenv("POD_IP")
}

// replica is this server's place among several; the zero value (no
// cluster) is a server on its own.
type replica struct {
	cl       *cluster.Cluster
	fwd      *cluster.Forwarder
	token    string
	ln       net.Listener
	draining atomic.Bool
	drainFor time.Duration
	// inflight counts the requests being served (POSTs: calls) on either
	// endpoint, whichever replica's session they are for: a drain waits
	// for them, not only for this replica's pool.
	inflight atomic.Int64
	srv      *http.Server
	// drainStart is when the drain began: the handoff that follows keeps
	// within its time.
	drainStart time.Time
	// With a snapshot store (attach): the sessions whose snapshots this
	// replica hands over as it stops and adopts from others, the largest
	// snapshot it takes, and how long a handoff record lasts.
	sessions    *engine.Sessions
	maxSnapshot int64
	recordTTL   time.Duration
	log         *slog.Logger
}

// join registers this replica when --internal-http is given. The flags
// were checked (check).
func (f *replicaFlags) join(ctx context.Context, sh *shared, log *slog.Logger) (*replica, error) {
	r := &replica{drainFor: time.Duration(f.drain)}
	if f.internalAddr == "" {
		return r, nil
	}
	token, err := readSecretFile(f.tokenFile, "--replica-token-file")
	if err != nil {
		return nil, err
	}
	if len(token) < 32 {
		return nil, fmt.Errorf("--replica-token-file: the token has %d characters; use at least 32 (openssl rand -hex 32)", len(token))
	}
	// The token also signs the audit anchors this replica writes there.
	sh.store.UseReplicaKey([]byte(token))
	name := f.name
	if name == "" {
		name = os.Getenv("POD_NAME")
	}
	if name == "" {
		name, _ = os.Hostname()
	}
	ln, err := net.Listen("tcp", f.internalAddr)
	if err != nil {
		return nil, fmt.Errorf("--internal-http: %w", err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	base := "http://" + net.JoinHostPort(f.advertised(), port)
	cl, err := cluster.Join(ctx, sh.store.Directory(), strings.ToLower(name), base, base, []byte(token), log)
	if err != nil {
		ln.Close()
		return nil, err
	}
	r.cl, r.fwd, r.token, r.ln = cl, cl.NewForwarder(token), token, ln
	log.Info("replica joined", "replica", cl.Self().Name, "incarnation", cl.Self().Incarnation, "internal", base)
	return r, nil
}

func (r *replica) sessionSuffix() string {
	if r.cl == nil {
		return ""
	}
	return r.cl.SessionSuffix()
}

// serveInternal serves the other replicas: /mcp, as the public endpoint
// (a request for an MCP session this replica owns, forwarded as it came),
// and the internal endpoint, for calls on this replica's sessions.
func (r *replica) serveInternal(public http.Handler, internal *mcp.Server, maxRequestBytes int64, log *slog.Logger) {
	if r.cl == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", public)
	mux.Handle(cluster.InternalPath, cluster.InternalAuth(r.token, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return internal },
		&mcp.StreamableHTTPOptions{Stateless: true, Logger: log, MaxRequestBodyBytes: maxRequestBytes})))
	// Paused sessions a replica that stops hands over (handoff.go).
	mux.Handle("POST "+cluster.SnapshotPath+"{id}", cluster.InternalAuth(r.token, http.HandlerFunc(r.receiveSnapshot)))
	r.srv = &http.Server{Handler: r.count(mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpserver.IdleTimeout, MaxHeaderBytes: 64 << 10}
	go func() {
		if err := r.srv.Serve(r.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("internal endpoint stopped", "err", err)
		}
	}()
}

// count counts the calls being served.
func (r *replica) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost {
			r.inflight.Add(1)
			defer r.inflight.Add(-1)
		}
		next.ServeHTTP(w, req)
	})
}

// busy is what is under way: runs of this replica's pool and queue, and
// calls being served (session runs, calls forwarded to other replicas).
func (r *replica) busy(eng *engine.Engine) int64 {
	return int64(eng.Running()+eng.Waiting()) + r.inflight.Load()
}

// drain refuses new sessions, waits for what is under way (at most
// --drain-timeout), and returns.
func (r *replica) drain(eng *engine.Engine, log *slog.Logger) {
	r.draining.Store(true)
	r.drainStart = time.Now()
	deadline := r.drainStart.Add(r.drainFor)
	start := time.Now()
	for r.busy(eng) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	log.Info("drained", "waited", time.Since(start).Round(time.Millisecond), "calls_left", r.busy(eng))
}

// shutdown stops taking requests from the others (their proxied MCP
// requests and forwarded calls), waiting up to wait for those under way.
func (r *replica) shutdown(wait time.Duration) {
	if r.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	r.srv.Shutdown(ctx)
	cancel()
}

// waitIdle waits, at most limit, until nothing is under way: a call a
// request began just before the servers stopped still gets its audit
// record, which the log takes until it closes after this.
func (r *replica) waitIdle(eng *engine.Engine, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for r.busy(eng) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// leave removes this replica from the directory: its sessions are lost to
// the others from now on.
func (r *replica) leave() {
	if r.cl == nil {
		return
	}
	r.shutdown(2 * time.Second)
	r.fwd.Close()
	r.cl.Leave()
}

// readSecretFile reads a one-line secret from a file others cannot read.
func readSecretFile(path, flagName string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	if st.Mode().IsRegular() && st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s: %s can be read by others (mode %v); chmod 600 it", flagName, path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// anchorAudit writes the audit chain's head to the shared store every
// anchorEvery, and once more when the returned func is called.
func anchorAudit(st *sharedstate.Store, replica string, w *audit.Writer, log *slog.Logger) func() {
	const anchorEvery = 10 * time.Second
	stop, done := make(chan struct{}), make(chan struct{})
	anchor := func() {
		// Written again even when unchanged: a store that lost its data
		// gets it back (an anchor never moves back).
		seq, head := w.Head()
		if seq == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := st.SetAnchor(ctx, replica, audit.Anchor{Seq: seq, Head: head}); err != nil {
			log.Warn("audit anchor not written to the shared store", "err", err)
		}
	}
	go func() {
		defer close(done)
		// At once too: a replica killed before its first tick would
		// otherwise leave a chain no anchor asks for.
		anchor()
		t := time.NewTicker(anchorEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				anchor()
				return
			case <-t.C:
				anchor()
			}
		}
	}()
	return func() {
		close(stop)
		<-done
	}
}
