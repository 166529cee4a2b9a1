package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/policy"
)

// State is what the live view shows; the page renders it from
// /console/events (Server-Sent Events) as it changes. Every string an
// agent wrote in it has been made inert (see inert).
type State struct {
	Operator string        `json:"operator"`
	Running  []RunView     `json:"running"`
	Pending  []PendingView `json:"pending"`
	Sessions []SessionView `json:"sessions"`
	// RunningTotal and PendingTotal count all of them; the lists hold
	// the oldest MaxListed.
	RunningTotal int             `json:"running_total"`
	PendingTotal int             `json:"pending_total"`
	Queue        int             `json:"queue"`
	InFlight     int             `json:"in_flight"`
	Recent       []activity.Done `json:"recent"`
	At           time.Time       `json:"at"`
}

// RunView is a call in flight as the page shows it.
type RunView struct {
	activity.Call
	ElapsedMS int64 `json:"elapsed_ms"`
}

// SessionView is an open session as the page shows it: with its owner,
// which the agents' own list_sessions does not show.
type SessionView struct {
	engine.SessionInfo
	Owner  string `json:"owner"`
	AgeSec int64  `json:"age_s"`
}

// MaxListed bounds each list of the live view (runs in flight, sessions):
// the page stays small and quick however many there are.
const MaxListed = 100

// PendingView is a call waiting for an operator as the page shows it.
type PendingView struct {
	activity.Approval
	// NonASCII lists the characters outside ASCII in its code, facts and
	// values (at most 16 here, 64 on its review page), as "U+0435 е",
	// letters of other scripts than Latin first: a look-alike letter can
	// make one name read as another.
	NonASCII []string `json:"non_ascii,omitempty"`
	// Controls says the code holds control or invisible characters (a
	// carriage return or form feed that Python reads as a line break or
	// an indentation reset, a bidi override), shown as escapes.
	Controls bool `json:"controls,omitempty"`
	// Inline says the live view shows the call whole and plain, so it may
	// be approved there; otherwise only from its review page.
	Inline bool `json:"inline"`
}

// scan is what the console found in a waiting call's whole text.
type scan struct {
	nonASCII string // its distinct characters outside ASCII
	controls bool
}

func scanText(texts ...string) scan {
	var sc scan
	seen := map[rune]bool{}
	for _, t := range texts {
		for _, r := range t {
			switch {
			case r == '\n' || r == '\t':
			case r < 0x20 || r == 0x7f || hidden(r):
				sc.controls = true
			case r >= 0x80 && !seen[r] && len(seen) < 4096:
				seen[r] = true
				sc.nonASCII += string(r)
			}
		}
	}
	return sc
}

func pendingView(a activity.Approval, sc scan, listed int) PendingView {
	a.ID, a.Identity, a.Tool, a.Facts, a.Code, a.Detail = inertLine(a.ID), inertLine(a.Identity), inertLine(a.Tool), inert(a.Facts), inert(a.Code), inert(a.Detail)
	v := PendingView{Approval: a, NonASCII: nonASCII(sc.nonASCII, listed), Controls: sc.controls}
	v.Inline = !a.CodeCut && !a.DetailCut && a.DetailBytes == 0 && sc.nonASCII == "" && !sc.controls
	return v
}

// scanOf scans a waiting call's whole code, facts and values (the live
// view lists only the first lines), once per call.
func (c *Console) scanOf(a activity.Approval) scan {
	key := a.ID + "/" + a.Digest
	c.mu.Lock()
	sc, ok := c.scanned[key]
	c.mu.Unlock()
	if ok {
		return sc
	}
	whole, _ := c.cfg.Activity.Get(a.ID)
	sc = scanText(whole.Code, whole.Facts, whole.Detail, whole.Identity)
	c.mu.Lock()
	if len(c.scanned) > 4*activity.MaxWaiting {
		clear(c.scanned)
	}
	c.scanned[key] = sc
	c.mu.Unlock()
	return sc
}

func (c *Console) state(op string) State {
	st := State{Operator: op, At: time.Now().UTC(), Sessions: []SessionView{}, Running: []RunView{}, Pending: []PendingView{}}
	pending := c.cfg.Activity.Pending()
	st.PendingTotal = len(pending)
	for _, a := range pending[:min(len(pending), MaxListed)] {
		st.Pending = append(st.Pending, pendingView(a, c.scanOf(a), 16))
	}
	running := c.cfg.Activity.Running()
	st.RunningTotal = len(running)
	for _, call := range running[:min(len(running), MaxListed)] {
		call.ID, call.Identity, call.Tool, call.Session, call.Code = inertLine(call.ID), inertLine(call.Identity), inertLine(call.Tool), inertLine(call.Session), inert(call.Code)
		st.Running = append(st.Running, RunView{Call: call, ElapsedMS: time.Since(call.Started).Milliseconds()})
	}
	if c.cfg.Sessions != nil {
		list := c.cfg.Sessions.List()
		sort.Slice(list, func(i, j int) bool { return list[i].Created.Before(list[j].Created) })
		for _, si := range list[:min(len(list), MaxListed)] {
			st.Sessions = append(st.Sessions, SessionView{SessionInfo: si, Owner: inertLine(si.Owner), AgeSec: int64(time.Since(si.Created).Seconds())})
		}
		sort.Slice(st.Sessions, func(i, j int) bool { return st.Sessions[i].Created.Before(st.Sessions[j].Created) })
	}
	if c.cfg.Engine != nil {
		st.Queue, st.InFlight = c.cfg.Engine.Waiting(), c.cfg.Engine.Running()
	}
	st.Recent = c.cfg.Activity.RecentCalls(50)
	for i := range st.Recent {
		d := &st.Recent[i]
		d.ID, d.Identity, d.Tool = inertLine(d.ID), inertLine(d.Identity), inertLine(d.Tool)
	}
	return st
}

func (c *Console) live(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	c.render(w, "live.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "State": c.state(s.operator), "Notice": c.takeNotice(s)})
}

func (c *Console) stateJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c.state(operator(r).operator))
}

// events pushes the state whenever the activity changes, and every
// second (elapsed times move).
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	changes, stop := c.cfg.Activity.Subscribe()
	defer stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	s := operator(r)
	for {
		// A session signed out, expired or revoked (its token removed
		// and the file reloaded) ends its stream too, within a tick.
		if !c.valid(s) {
			return
		}
		data, _ := json.Marshal(c.state(s.operator))
		fmt.Fprintf(w, "event: state\ndata: %s\n\n", data)
		flusher.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-changes:
			// Coalesce a burst of changes.
			time.Sleep(100 * time.Millisecond)
		case <-tick.C:
		}
	}
}

func (c *Console) kill(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	id := r.PathValue("id")
	call, err := c.cfg.Activity.Kill(id, s.operator)
	if err != nil {
		c.back(w, r, "/console", err.Error())
		return
	}
	if err := c.record(s.operator, "kill", id, fmt.Sprintf("%s of %s", call.Tool, call.Identity)); err != nil {
		c.back(w, r, "/console", "stopped, but the audit log could not record it: "+err.Error())
		return
	}
	c.back(w, r, "/console", fmt.Sprintf("stopped %s of %s", call.Tool, call.Identity))
}

func (c *Console) decide(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	id := r.PathValue("id")
	approve := r.PathValue("verdict") == "approve"
	a, err := c.cfg.Activity.Decide(id, approve, s.operator, r.PostFormValue("digest"))
	if err != nil {
		c.back(w, r, "/console", err.Error())
		return
	}
	action := "decline"
	if approve {
		action = "approve"
	}
	c.record(s.operator, action, id, fmt.Sprintf("%s of %s, arguments sha256:%s", a.Tool, a.Identity, a.Digest))
	c.back(w, r, "/console", fmt.Sprintf("%sd %s of %s", action, a.Tool, a.Identity))
}

// review shows one waiting call whole (its facts, all its code, the
// digest of its arguments), with the only Approve button of a call whose
// code the live view cannot show whole.
func (c *Console) review(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	a, ok := c.cfg.Activity.Get(r.PathValue("id"))
	if !ok {
		c.back(w, r, "/console", "that call no longer waits for an operator (it was decided, or gave up)")
		return
	}
	v := pendingView(a, scanText(a.Code, a.Facts, a.Detail, a.Identity), 64)
	c.render(w, "review.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "A": v})
}

func (c *Console) closeSession(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	id := r.PathValue("id")
	if c.cfg.Sessions == nil {
		c.back(w, r, "/console", "this server has no sessions")
		return
	}
	if err := c.cfg.Sessions.Close(id); err != nil {
		c.back(w, r, "/console", "could not close "+id+": "+err.Error())
		return
	}
	c.record(s.operator, "close_session", id, "")
	c.back(w, r, "/console", "closed session "+id)
}

// back redirects to path, where notice is shown once.
func (c *Console) back(w http.ResponseWriter, r *http.Request, path, notice string) {
	if s := operator(r); s != nil {
		c.mu.Lock()
		s.notice = inert(cut(notice, 500))
		c.mu.Unlock()
	}
	http.Redirect(w, r, path, http.StatusSeeOther)
}

// takeNotice is the operator's pending notice, now shown.
func (c *Console) takeNotice(s *opSession) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := s.notice
	s.notice = ""
	return n
}

// filter is the audit browser's query.
type filter struct {
	Identity, Tool, Decision, Text string
	Since, Until                   time.Time
	Seq                            int64 // one record, 0 for any
}

// query is the filter as a URL query, for the download link.
func (f filter) query() template.URL {
	v := url.Values{}
	for k, x := range map[string]string{"identity": f.Identity, "tool": f.Tool, "decision": f.Decision, "q": f.Text,
		"since": localInput(f.Since), "until": localInput(f.Until)} {
		if x != "" {
			v.Set(k, x)
		}
	}
	if f.Seq != 0 {
		v.Set("seq", strconv.FormatInt(f.Seq, 10))
	}
	return template.URL(v.Encode())
}

// Decisions are the values a record's decision takes, for the filter.
var Decisions = []string{"allow", "approved", "approval_requested", "declined", "deny", "rate_limited", "error"}

// SinceInput and UntilInput are the filter's times as a datetime-local
// input shows them.
func (f filter) SinceInput() string { return localInput(f.Since) }
func (f filter) UntilInput() string { return localInput(f.Until) }

func localInput(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04")
}

func (f filter) match(r *audit.Record) bool {
	switch {
	case f.Seq != 0 && r.Seq != f.Seq:
		return false
	case f.Identity != "" && !strings.Contains(strings.ToLower(r.Identity), strings.ToLower(f.Identity)),
		f.Tool != "" && r.Tool != f.Tool,
		f.Decision != "" && r.Decision != f.Decision,
		!f.Since.IsZero() && r.Time.Before(f.Since),
		!f.Until.IsZero() && r.Time.After(f.Until),
		f.Text != "" && !strings.Contains(strings.ToLower(string(r.Arguments)+" "+r.Reason+" "+r.Error), strings.ToLower(f.Text)):
		return false
	}
	return true
}

func parseFilter(r *http.Request) filter {
	q := r.URL.Query()
	f := filter{Identity: cut(q.Get("identity"), 200), Tool: cut(q.Get("tool"), 100), Decision: cut(q.Get("decision"), 50), Text: cut(q.Get("q"), 500)}
	f.Seq, _ = strconv.ParseInt(q.Get("seq"), 10, 64)
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, q.Get("since")); err == nil {
			f.Since = t
		}
		if t, err := time.Parse(layout, q.Get("until")); err == nil {
			f.Until = t
		}
	}
	return f
}

// maxAuditRows bounds a page of the audit browser (the newest matches).
const maxAuditRows = 200

// auditRow is what the list shows of a record: never the whole record,
// whose arguments may be megabytes.
type auditRow struct {
	Seq                                     int64
	Time                                    time.Time
	Identity, Event, Tool, Decision, Status string
	Reason, Code                            string // previews
}

// auditProblems are what the list could not show: lines skipped as
// edited or malformed, and gaps in the sequence.
type auditProblems struct {
	Bad  []string // "audit.log line 7: record edited" (the first few)
	NBad int
	Gaps int
}

func (c *Console) matches(f filter, limit int) ([]auditRow, int, auditProblems, error) {
	var probs auditProblems
	if c.cfg.AuditPath == "" {
		return nil, 0, probs, fmt.Errorf("this server keeps no audit log (--audit-log)")
	}
	files, err := audit.Files(c.cfg.AuditPath)
	if err != nil {
		return nil, 0, probs, err
	}
	var rows []auditRow
	total := 0
	var last int64
	err = audit.ReadChecked(files, func(r *audit.Record, _ string) bool {
		if last != 0 && r.Seq != last+1 {
			probs.Gaps++
		}
		last = r.Seq
		if !f.match(r) {
			return true
		}
		total++
		rows = append(rows, auditRow{Seq: r.Seq, Time: r.Time, Identity: cut(r.Identity, 200), Event: r.Event, Tool: cut(r.Tool, 200),
			Decision: cut(r.Decision, 40), Status: cut(r.Status, 40), Reason: cut(r.Reason, 200), Code: cut(codeOf(r.Arguments), 300)})
		if len(rows) > limit {
			rows = rows[1:]
		}
		return true
	}, func(path string, line int, err error) {
		probs.NBad++
		if len(probs.Bad) < 5 {
			probs.Bad = append(probs.Bad, fmt.Sprintf("%s line %d: %v", filepath.Base(path), line, err))
		}
	})
	// Newest first.
	for i, j := 0, len(rows)-1; i < j; i, j = i+1, j-1 {
		rows[i], rows[j] = rows[j], rows[i]
	}
	return rows, total, probs, err
}

func codeOf(args json.RawMessage) string {
	var a struct {
		Code string `json:"code"`
	}
	json.Unmarshal(args, &a)
	return a.Code
}

func (c *Console) auditList(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	f := parseFilter(r)
	rows, total, probs, err := c.matches(f, maxAuditRows)
	data := map[string]any{"Op": s.operator, "CSRF": s.csrf, "Rows": rows, "Total": total, "F": f, "Query": f.query(), "Decisions": Decisions,
		"Problems": probs,
		"Notice":   c.takeNotice(s)}
	if err != nil {
		data["Error"] = err.Error()
	}
	c.render(w, "audit.html", data)
}

func (c *Console) auditRecord(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || c.cfg.AuditPath == "" {
		http.NotFound(w, r)
		return
	}
	files, err := audit.Files(c.cfg.AuditPath)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var (
		rec        *audit.Record
		hash, file string
	)
	for _, f := range files {
		audit.Read([]string{f}, func(r *audit.Record, h string) bool {
			if r.Seq == seq {
				rec, hash, file = r, h, filepath.Base(f)
				return false
			}
			return true
		})
		if rec != nil {
			break
		}
	}
	if rec == nil {
		http.NotFound(w, r)
		return
	}
	pretty, _ := json.MarshalIndent(rec, "", "  ")
	c.render(w, "record.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "R": rec, "Hash": hash, "File": file,
		"PrevSeq": max(rec.Seq-1, 1), "NextSeq": rec.Seq + 1, "Code": codeOf(rec.Arguments), "JSON": string(pretty)})
}

// auditDownload streams the matching records, oldest first, as they are
// read: nothing but the record at hand is held.
func (c *Console) auditDownload(w http.ResponseWriter, r *http.Request) {
	if c.cfg.AuditPath == "" {
		http.Error(w, "this server keeps no audit log (--audit-log)", http.StatusNotFound)
		return
	}
	files, err := audit.Files(c.cfg.AuditPath)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	f := parseFilter(r)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", `attachment; filename="pysandbox-audit.jsonl"`)
	enc := json.NewEncoder(w)
	audit.Read(files, func(rec *audit.Record, _ string) bool {
		if f.match(rec) {
			if enc.Encode(rec) != nil {
				return false // the browser went away
			}
		}
		return true
	})
}

func (c *Console) auditVerify(w http.ResponseWriter, r *http.Request) {
	notice := "this server keeps no audit log"
	if c.cfg.AuditPath != "" {
		files, err := audit.Files(c.cfg.AuditPath)
		if err == nil {
			var rep *audit.Report
			// Strictly: a chain cut at the front or ended early does not
			// verify here either (the server never removes its own files).
			if rep, err = audit.Check(files, audit.Expect{}); err == nil {
				notice = fmt.Sprintf("the chain verifies: %d records (seq %d..%d) in %d files, head %s", rep.Records, rep.FirstSeq, rep.LastSeq, rep.Files, rep.Head)
			}
		}
		if err != nil {
			notice = "THE CHAIN DOES NOT VERIFY: " + err.Error()
		}
	}
	c.back(w, r, "/console/audit", notice)
}

// maxCounterIdentities bounds the identities whose counters the policy
// page reads for each per-identity limit: those of the most recent calls.
const maxCounterIdentities = 20

// counterRow is one rate-limit counter as the policy page shows it.
type counterRow struct {
	Identity string // "" for a limit everyone shares
	Used     int64
	Percent  int
}

type limitView struct {
	Limit    string
	Max      int64
	Resets   string
	Counters []counterRow
	Err      string
}

type ruleView struct {
	Tool, Action, By, Reason string
	Limits                   []limitView
}

func (c *Console) policyPage(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	pol := c.cfg.Policy()
	// Per-identity counters are read for the identities seen lately.
	var ids []string
	seen := map[string]bool{}
	for _, d := range c.cfg.Activity.RecentCalls(activity.Recent) {
		if !seen[d.Identity] && len(ids) < maxCounterIdentities {
			seen[d.Identity] = true
			ids = append(ids, d.Identity)
		}
	}
	sort.Strings(ids)
	counts, _ := c.cfg.Limiter.(policy.CountReader)
	var rules []ruleView
	for name, tr := range pol.Tools {
		rv := ruleView{Tool: inert(name), Action: string(tr.Action), By: tr.By, Reason: inert(tr.Reason)}
		for _, l := range tr.Limits {
			lv := limitView{Limit: l.String(), Max: l.Max}
			if counts != nil {
				n, reset, err := counts.Counts(r.Context(), l, ids)
				if err != nil {
					lv.Err = err.Error()
				} else {
					lv.Resets = time.Until(reset).Round(time.Second).String()
					for i, used := range n {
						row := counterRow{Used: used, Percent: int(min(100, used*100/max(l.Max, 1)))}
						if l.Scope != policy.ScopeGlobal {
							row.Identity = inertLine(ids[i])
						}
						lv.Counters = append(lv.Counters, row)
					}
				}
			}
			rv.Limits = append(rv.Limits, lv)
		}
		rules = append(rules, rv)
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].Tool < rules[j].Tool })
	pretty, _ := json.MarshalIndent(pol, "", "  ")
	c.render(w, "policy.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "P": pol, "Rules": rules, "JSON": inert(string(pretty)),
		"Counted": counts != nil, "Identities": len(ids)})
}
