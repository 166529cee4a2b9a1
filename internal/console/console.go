// Package console is the operator's page at /console (serve --http
// --console): what agents run, live; a way to stop a run or close a
// session; the audit trail, searchable; the policy in force.
//
// Operators sign in with tokens of their own (--operator-token-file),
// never an agent's, and an operator's token never reaches /mcp. Signing
// in trades the token for a session cookie (HttpOnly, SameSite=Strict,
// Secure over TLS) and a CSRF token that every action must carry, and
// every action must come from the console's own origin. Everything an
// agent wrote (code, output, identities, arguments) is hostile: it is
// rendered by html/template on the server and by textContent in the
// browser, never as markup.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/httpserver"
	"github.com/pysandbox/pysandbox/internal/policy"
)

//go:embed assets templates
var files embed.FS

// Config is what the console shows and acts on.
type Config struct {
	// Operators are the operators' tokens (--operator-token-file). A
	// sign-in lasts while the token it was made with is one of them: a
	// reload that removes it ends the sign-in's session.
	Operators *httpserver.Tokens
	Activity  *activity.Registry
	Sessions  *engine.Sessions
	Engine    *engine.Engine
	// AuditPath is the audit log (--audit-log), "" without one; Audit
	// writes the operators' actions to it.
	AuditPath string
	Audit     *audit.Writer
	// Policy is the policy in force now.
	Policy func() *policy.Policy
	// Limiter is the server's rate limiter; the policy page shows its
	// counters when it can read them (policy.CountReader).
	Limiter policy.RateLimiter
	Log     *slog.Logger
}

// SessionTTL is how long a console sign-in lasts.
const SessionTTL = 12 * time.Hour

// Console serves /console.
type Console struct {
	cfg  Config
	tmpl *template.Template

	mu       sync.Mutex
	sessions map[string]*opSession // by cookie value
	scanned  map[string]scan       // see scanOf
}

type opSession struct {
	operator string
	// cred is the token the operator signed in with, checked on every
	// request: removing it from the file ends the session.
	cred    httpserver.Credential
	csrf    string
	expires time.Time
	// ended is set when the operator signs out or their token is found
	// revoked, so an event stream the session opened ends too.
	ended bool
	// notice is what the last action said, shown once by the next page
	// (kept here rather than in the URL, so nobody can put words in the
	// console's mouth with a crafted link).
	notice string
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	tmpl, err := template.New("").Funcs(template.FuncMap{
		"ago":     ago,
		"mib":     func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) },
		"rfc":     func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"short":   func(s string, n int) string { return cut(s, n) },
		"inert":   inert,
		"line":    inertLine,
		"secs":    secs,
		"mul1000": func(n int64) int64 { return n * 1000 },
		"cutat":   func(s string, n int) bool { return len(s) > n },
		"pair":    func(a any, csrf string) map[string]any { return map[string]any{"A": a, "CSRF": csrf} },
		"seg":     seg,
	}).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	return &Console{cfg: cfg, tmpl: tmpl, sessions: map[string]*opSession{}, scanned: map[string]scan{}}, nil
}

// Handler serves everything under /console.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(files, "assets")
	fileServer := http.StripPrefix("/console/assets/", http.FileServerFS(assets))
	mux.Handle("GET /console/assets/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Files only: no directory listings.
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		fileServer.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /console/login", c.loginPage)
	mux.HandleFunc("POST /console/login", c.login)
	mux.Handle("POST /console/logout", c.action(c.logout))
	mux.Handle("GET /console", c.page(c.live))
	mux.Handle("GET /console/{$}", c.page(c.live))
	mux.Handle("GET /console/events", c.page(c.events))
	mux.Handle("GET /console/state", c.page(c.stateJSON))
	mux.Handle("POST /console/runs/{id}/kill", c.action(c.kill))
	mux.Handle("POST /console/sessions/{id}/close", c.action(c.closeSession))
	mux.Handle("GET /console/approvals/{id}", c.page(c.review))
	mux.Handle("POST /console/approvals/{id}/{verdict}", c.action(func(w http.ResponseWriter, r *http.Request) {
		if v := r.PathValue("verdict"); v != "approve" && v != "decline" {
			http.NotFound(w, r)
			return
		}
		c.decide(w, r)
	}))
	mux.Handle("GET /console/audit", c.page(c.auditList))
	mux.Handle("GET /console/audit/{seq}", c.page(c.auditRecord))
	mux.Handle("GET /console/audit.jsonl", c.page(c.auditDownload))
	mux.Handle("POST /console/audit/verify", c.action(c.auditVerify))
	mux.Handle("GET /console/policy", c.page(c.policyPage))
	return securityHeaders(mux)
}

// securityHeaders: no framing, no sniffing, no script or style from
// anywhere but the console itself, and nothing inline.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		// same-origin, not no-referrer: under no-referrer a browser sends
		// "Origin: null" with the console's own form posts, which the origin
		// check must refuse.
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

const cookieName = "pysandbox_console"

type ctxKey struct{}

// operator is the signed-in operator of a request that went through page
// or action.
func operator(r *http.Request) *opSession {
	s, _ := r.Context().Value(ctxKey{}).(*opSession)
	return s
}

func (c *Console) session(r *http.Request) *opSession {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[ck.Value]
	if s == nil || !c.validLocked(s) {
		delete(c.sessions, ck.Value)
		return nil
	}
	return s
}

// valid reports whether a signed-in session still stands: not signed
// out, not expired, and its operator's token still in the file in force.
func (c *Console) valid(s *opSession) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.validLocked(s)
}

func (c *Console) validLocked(s *opSession) bool {
	if !s.ended && (time.Now().After(s.expires) || !c.cfg.Operators.Holds(s.cred)) {
		s.ended = true
	}
	return !s.ended
}

// page requires a signed-in operator; the login page otherwise.
func (c *Console) page(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.session(r)
		if s == nil {
			if strings.HasPrefix(r.URL.Path, "/console/events") || strings.HasPrefix(r.URL.Path, "/console/state") {
				http.Error(w, "sign in first", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/console/login", http.StatusSeeOther)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	})
}

// action requires a signed-in operator, the session's CSRF token in the
// form, and a same-origin request.
func (c *Console) action(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.session(r)
		if s == nil {
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		if !sameOrigin(r) {
			http.Error(w, "refused: a console action must come from the console's own page (Origin)", http.StatusForbidden)
			return
		}
		bodyDeadline(w)
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
			http.Error(w, "refused: the form's CSRF token is missing or stale; reload the page", http.StatusForbidden)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	})
}

// sameOrigin: a browser sends Origin (or at least Referer) on a POST; it
// must name the host the request was sent to.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		origin = r.Header.Get("Referer")
	}
	if origin == "" {
		return false
	}
	for _, p := range []string{"http://", "https://"} {
		if rest, ok := strings.CutPrefix(origin, p); ok {
			host, _, _ := strings.Cut(rest, "/")
			return host == r.Host
		}
	}
	return false
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, "login.html", map[string]any{"Error": r.URL.Query().Get("error") != ""})
}

// bodyDeadline gives a form's sender a few seconds to send it: the
// server bounds only the headers' time, and a sign-in comes from anyone.
func bodyDeadline(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(10 * time.Second))
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	bodyDeadline(w)
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if !sameOrigin(r) {
		http.Error(w, "refused: sign in from the console's own page", http.StatusForbidden)
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	cred, ok := c.cfg.Operators.Find(token)
	if !ok || token == "" {
		c.cfg.Log.Warn("console: a sign-in with a token that is not an operator's", "remote", r.RemoteAddr)
		http.Redirect(w, r, "/console/login?error=1", http.StatusSeeOther)
		return
	}
	s := &opSession{operator: cred.Name, cred: cred, csrf: randomHex(32), expires: time.Now().Add(SessionTTL)}
	id := randomHex(32)
	c.mu.Lock()
	for k, old := range c.sessions {
		if !c.validLocked(old) {
			delete(c.sessions, k)
		}
	}
	c.sessions[id] = s
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/console", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int(SessionTTL / time.Second)})
	c.record(s.operator, "sign_in", "", "")
	http.Redirect(w, r, "/console", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		c.mu.Lock()
		if s := c.sessions[ck.Value]; s != nil {
			s.ended = true
		}
		delete(c.sessions, ck.Value)
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// record writes an operator's action to the audit log.
func (c *Console) record(op, action, target, detail string) error {
	c.cfg.Log.Info("console", "operator", op, "action", action, "target", target)
	if c.cfg.Audit == nil {
		return nil
	}
	d := map[string]string{"action": action}
	if target != "" {
		d["target"] = target
	}
	if detail != "" {
		d["detail"] = detail
	}
	return c.cfg.Audit.Append(&audit.Record{Event: EventOperator, Identity: "operator:" + op, Detail: d})
}

// EventOperator is the audit event of an operator's action.
const EventOperator = "operator"

func (c *Console) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.tmpl.ExecuteTemplate(w, name, data); err != nil {
		c.cfg.Log.Error("console: render", "template", name, "err", err)
	}
}

// ago says how long ago t was, as the live view's script does.
func ago(t time.Time) string {
	d := time.Since(t)
	if d < time.Second {
		return "just now"
	}
	return secs(d.Round(time.Second).Milliseconds()) + " ago"
}

// secs shows a duration in milliseconds as people read it: 850 ms, 12.3 s,
// 4m05s.
func secs(ms int64) string {
	switch {
	case ms < 1000:
		return fmt.Sprintf("%d ms", ms)
	case ms < 60000:
		return fmt.Sprintf("%.1f s", float64(ms)/1000)
	default:
		return fmt.Sprintf("%dm%02ds", ms/60000, ms/1000%60)
	}
}

// seg is a value as one segment of a URL path: every byte but letters,
// digits, '-' and '_' percent-encoded, so no value can add a segment
// ('/'), a query ('?') or a fragment ('#') to a form's action and send the
// operator's click to another action. html/template escapes quotes and
// markup in a URL but leaves those alone. A value of dots alone ("..")
// cannot be made a segment at all, since browsers read "%2E%2E" as ".."
// too: it becomes "-", which names nothing (the console's own IDs never
// are dots).
func seg(s string) string {
	if strings.Trim(s, ".") == "" {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// cut shortens s to at most n bytes at a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return engine.Head(s, n) + "…"
}
