// Package tools is the MCP face of pysandbox: it registers the tools on an
// MCP server and turns each call into an engine request. Failures an agent
// should see and act on are tool results with isError set and a message
// saying what to do next, never protocol errors.
package tools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/egress"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/govern"
	"github.com/pysandbox/pysandbox/internal/interp"
	"github.com/pysandbox/pysandbox/internal/policy"
	"github.com/pysandbox/pysandbox/internal/quota"
	"github.com/pysandbox/pysandbox/internal/upstream"
)

// Version is reported to MCP clients.
var Version = "0.1.0"

// MaxCodeBytes caps the code of one call (the engine's cap).
const MaxCodeBytes = engine.MaxCodeBytes

// Options configure the tools.
type Options struct {
	Engine *engine.Engine
	// Posture, when set, is the posture measured at startup. When nil it is
	// measured on first use.
	Posture *engine.Posture
	// Sessions serves create_session and friends; nil starts a manager
	// with defaults (and the caller should Shutdown it through the server's
	// cleanup).
	Sessions *engine.Sessions
	// MaxUploadBytes caps one upload_file; MaxInlineBytes is the largest
	// file or figure returned inline; MaxDownloadBytes the largest
	// resources/read. Zero means the defaults (16 MiB, the engine's
	// MaxFigureBytes, 64 MiB).
	MaxUploadBytes, MaxInlineBytes, MaxDownloadBytes int64
	// MaxReplyBytes bounds a tool result as it goes on the wire (JSON
	// escapes included): figures beyond it become resource links, and
	// output is cut further (see reply.go). Zero means DefaultMaxReply.
	MaxReplyBytes int64
	// MaxStreamReplyBytes is how much of each of a run's stdout, stderr
	// and return value its reply shows (head and tail); the whole is kept
	// where the reply says (outputs.go). A reply's text, both channels
	// together, stays within five times it. Zero means
	// DefaultMaxStreamReply.
	MaxStreamReplyBytes int64
	// Quotas bound what each caller holds at once (runs executing and
	// waiting); nil: no per-caller bound. Session quotas are the engine's
	// (SessionConfig.OwnerLimit).
	Quotas *quota.Quotas
	// Governance is the policy, audit log and metrics; the zero value
	// allows everything and records nothing.
	Governance Governance
	// Network is the proxy that gives runs the network the policy allows
	// (internal/egress); nil: runs have no network.
	Network *egress.Proxy
	// Upstreams are the MCP servers whose tools code may call (its
	// "tools" module); nil: none.
	Upstreams *upstream.Manager
	// Cluster and Forwarder, when set, make this server one replica of
	// several: its MCP session ids name it, and calls on sessions other
	// replicas own are re-issued there (internal/cluster).
	Cluster   *cluster.Cluster
	Forwarder *cluster.Forwarder
	// Profiles are tool sets with other servers' names and formats
	// (serve --tools); NoNative leaves pysandbox's own tools out.
	Profiles []Profile
	NoNative bool
	Logger   *slog.Logger
	// SDKLogger is what the MCP SDK logs to (Logger when nil). Its
	// informational lines name every MCP session id, which on a server
	// without tokens is enough to use that connection's sessions.
	SDKLogger *slog.Logger
	// StateNote says where paused sessions are kept, or why they are not
	// (check_environment shows it).
	StateNote string
}

// Names are the tools a server offers (before the policy hides any). A
// policy file may name only these.
var Names = []string{"run_python", "check_environment", "validate_script", "create_session", "list_sessions",
	"close_session", "pause_session", "resume_session", "install_package", "upload_file", "list_files", "download_file", "list_tools_in_sandbox"}

// server holds what the handlers share.
type server struct {
	stateNote string // Options.StateNote
	eng       *engine.Engine
	sessions  *engine.Sessions
	figures   *figureStore
	// outputs and displays keep what a one-shot run's reply only links to.
	outputs, displays *figureStore
	log               *slog.Logger
	posture           func(context.Context) *engine.Posture
	gov               *govern.Governor
	// governed are the tools whose calls are decided, audited and
	// counted: pysandbox's own (unless left out) and the profiles'.
	governed map[string]bool
	// inflight are the governed calls whose handlers run, by request
	// (see Host.Run).
	inflight sync.Map
	// argNames are the argument names of each governed tool (its input
	// schema's properties), for the policy's warnings.
	argNames sync.Map
	quotas   *quota.Quotas
	net      *egress.Proxy
	up       *upstream.Manager
	cl       *cluster.Cluster
	fwd      *cluster.Forwarder
	inbound  *inbound // calls forwarded here, to cancel

	netMu    sync.Mutex
	sessNets map[string]*sessionNet // by session id

	maxUpload, maxInline, maxDownload, maxReply int64
	// maxStream is what a reply shows of each stream (MaxStreamReplyBytes).
	maxStream int64

	profiles []Profile
	noNative bool
}

// NewServer returns an MCP server with every pysandbox tool registered.
func NewServer(opts Options) *mcp.Server {
	srv, _ := NewServers(opts)
	return srv
}

// NewServers returns the server and, with opts.Cluster, the server of the
// internal endpoint other replicas forward session calls to (nil
// without).
func NewServers(opts Options) (*mcp.Server, *mcp.Server) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &server{eng: opts.Engine, log: log, sessions: opts.Sessions, figures: newFigureStore(), outputs: newStore(outputPrefix, outputLimits), displays: newStore(displayPrefix, displayLimits), quotas: opts.Quotas, net: opts.Network, up: opts.Upstreams, sessNets: map[string]*sessionNet{},
		maxUpload: opts.MaxUploadBytes, maxInline: opts.MaxInlineBytes, maxDownload: opts.MaxDownloadBytes, profiles: opts.Profiles, noNative: opts.NoNative, stateNote: opts.StateNote}
	if s.sessions == nil {
		s.sessions = opts.Engine.NewSessions(engine.SessionConfig{})
	}
	if s.maxUpload <= 0 {
		s.maxUpload = defaultMaxUpload
	}
	stdioUpload.Store(s.maxUpload)
	if s.maxInline <= 0 {
		// Figures are scaled down to this size; files follow the same cap.
		s.maxInline = int64(opts.Engine.Config().MaxFigureBytes)
	}
	if s.maxReply = opts.MaxReplyBytes; s.maxReply <= 0 {
		s.maxReply = DefaultMaxReply
	}
	if s.maxStream = opts.MaxStreamReplyBytes; s.maxStream <= 0 {
		s.maxStream = DefaultMaxStreamReply
	}
	if s.maxDownload <= 0 {
		s.maxDownload = 64 << 20
	}
	// A resource read is a reply too: its base64 must fit.
	s.maxDownload = min(s.maxDownload, (s.maxReply-replyOverhead)*3/4)
	var once sync.Once
	p := opts.Posture
	s.posture = func(ctx context.Context) *engine.Posture {
		once.Do(func() {
			if p == nil {
				p = opts.Engine.Measure(ctx, interp.Discover(ctx))
			}
		})
		return p
	}
	var getSessionID func() string
	if opts.Cluster != nil {
		s.cl, s.fwd = opts.Cluster, opts.Forwarder
		s.inbound = newInbound()
		getSessionID = opts.Cluster.NewMCPSessionID
	}
	impl := &mcp.Implementation{Name: "pysandbox", Title: "pysandbox: sandboxed Python", Version: Version}
	instructions := "pysandbox runs Python 3 code in a fresh, isolated Linux sandbox for every call: " + s.networkWords() + ", no access to the host's files, " +
		"limited memory, processes and time. Use run_python to compute, analyse data or test code; create_session for multi-step work that keeps " +
		"variables and files between calls (upload_file, list_files, download_file move files in and out; plots come back as images); " +
		"check_environment to see the sandbox's limits and Python version; validate_script to check code without running it." + s.upstreamWords()
	if s.noNative && len(s.profiles) == 1 {
		// Alone, a profile is the server its clients were set up for.
		impl.Name, instructions = s.profiles[0].ServerName, s.profiles[0].Instructions
	} else if s.noNative {
		var parts []string
		for _, p := range s.profiles {
			parts = append(parts, p.Instructions)
		}
		instructions = strings.Join(parts, " ")
	} else {
		for _, p := range s.profiles {
			if p.Instructions != "" {
				instructions += " " + p.Instructions
			}
		}
	}
	sdkLog := opts.SDKLogger
	if sdkLog == nil {
		sdkLog = log
	}
	srv := mcp.NewServer(impl, &mcp.ServerOptions{GetSessionID: getSessionID, Instructions: instructions, Logger: sdkLog,
		// What a caller reads (its outputs, displays, figures, session
		// files) and lists (its tools, under a policy that may depend on
		// it) is its own: no intermediary may cache it for another
		// (the SDK's default scope is "public").
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.CacheScope = "private" }})
	s.sessions.SetDetached(connEnded(srv.Sessions))
	s.gov = govern.New(opts.Governance, govern.Sandbox{Limits: s.limitsText, Facts: s.codeFacts, FromRun: runFacts}, log)
	s.governed = map[string]bool{}
	if !s.noNative {
		for _, n := range Names {
			s.governed[n] = true
		}
	}
	for _, p := range s.profiles {
		for _, n := range p.Tools {
			s.governed[n] = true
		}
	}
	if s.net != nil {
		s.net.AddRecorder(s.gov.NetRecord)
	}
	s.register(srv)
	srv.AddReceivingMiddleware(s.middleware)
	// Outermost, so that a wait in the governor is kept alive too (live.go).
	srv.AddReceivingMiddleware(heartbeat)
	srv.AddSendingMiddleware(numberProgress)
	if up := opts.Governance.Updates; up != nil {
		go func() {
			for pol := range up {
				s.gov.SetPolicy(pol)
				// Clients are told the tool list changed.
				s.register(srv)
				log.Info("policy replaced", "source", pol.Source, "sha256", pol.SHA256)
			}
		}()
	}
	var internal *mcp.Server
	if s.cl != nil {
		internal = mcp.NewServer(&mcp.Implementation{Name: "pysandbox-internal", Version: Version}, &mcp.ServerOptions{Logger: sdkLog})
		s.registerInternal(internal)
	}
	return srv, internal
}

// register adds the tools and resources the policy offers, and removes
// those it denies outright; a call to a hidden tool still gets its reason
// from the middleware, which sees every call. Adding a tool again replaces
// it, so this also applies a new policy.
func (s *server) register(srv *mcp.Server) {
	names := Names
	if s.noNative {
		names = nil
	} else {
		s.addRunPython(srv)
		s.addCheckEnvironment(srv)
		s.addValidateScript(srv)
		s.addSessionTools(srv)
		s.addPauseTools(srv)
		s.addInstallPackage(srv)
		s.addFileTools(srv)
		s.addListTools(srv)
	}
	s.addFigureResources(srv)
	s.addOutputResources(srv)
	if s.noNative && len(s.profiles) > 0 {
		// Profiles link to session files (mcp-sandbox's file_links): they
		// are readable as resources, under download_file's rule.
		s.addFileResource(srv)
	}
	h := &Host{s: s, srv: srv}
	for _, p := range s.profiles {
		p.Register(h)
		names = append(slices.Clip(names), p.Tools...)
	}
	pol := s.gov.Policy()
	for _, name := range names {
		if pol.Hidden(name) {
			srv.RemoveTools(name)
		}
	}
	s.warnRules()
	// Session files are resources too; they follow download_file's rule.
	if pol.Decide("download_file").Action != policy.Allow {
		srv.RemoveResourceTemplates(FileTemplate)
	}
}

// Governance is the policy, audit log and metrics (internal/govern); the
// zero value allows everything and records nothing.
type Governance = govern.Config

// errorResult is a failure the agent should read and act on: the
// arguments, with status invalid_request.
func errorResult(msg string) *govern.Refusal {
	return &govern.Refusal{Status: govern.StatusInvalidRequest, Message: msg}
}

// Outcome is embedded in the output of every tool whose output has no
// status of its own: set only when the call was refused.
type Outcome struct {
	Status  string `json:"status,omitempty" jsonschema:"only when the call was refused: invalid_request, denied, busy, quota, install_error, sandbox_error or cancelled"`
	Message string `json:"message,omitempty" jsonschema:"only when the call was refused: what happened and what to do"`
}

// refusal is a call refused before anything ran, with its status; a
// handler returns it as its error.
func refusal(status govern.Status, msg string) *govern.Refusal {
	return &govern.Refusal{Status: status, Message: msg}
}

// takeQuota takes one of the caller's run slots (see internal/quota),
// waiting in one of its queue places if need be; a refusal is the result
// to return instead.
func (s *server) takeQuota(ctx context.Context, req *mcp.CallToolRequest) (func(), *govern.Refusal) {
	release, err := s.quotas.Run(ctx, identity(req))
	switch {
	case errors.Is(err, quota.ErrQuota):
		msg := fmt.Sprintf("Refused by your quota: %v. Nothing was run.", err)
		if callerOf(req).anonymous() {
			msg += " Every caller without a token counts against this one quota (nothing tells them apart), so the runs may be another's; wait for one to finish, or use a server started with --auth-token-file, where each token has a quota of its own."
		}
		return nil, refusal(govern.StatusQuota, msg)
	case err != nil:
		return nil, refusal(govern.StatusCancelled, "The call was cancelled while it waited for one of your runs to finish. Nothing was run.")
	}
	return release, nil
}

// busyResult answers a call the server cannot take now.
func busyResult(err error) *govern.Refusal {
	return refusal(govern.StatusBusy, fmt.Sprintf("The server is busy (%v). Nothing was run; try again shortly.", err))
}
