package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/activity"
	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/engine"
)

// State is what the live view shows; the page renders it from
// /console/events (Server-Sent Events) as it changes.
type State struct {
	Operator string               `json:"operator"`
	Running  []RunView            `json:"running"`
	Pending  []activity.Approval  `json:"pending"`
	Sessions []engine.SessionInfo `json:"sessions"`
	Queue    int                  `json:"queue"`
	InFlight int                  `json:"in_flight"`
	Recent   []activity.Done      `json:"recent"`
	At       time.Time            `json:"at"`
}

// RunView is a call in flight as the page shows it.
type RunView struct {
	activity.Call
	ElapsedMS int64 `json:"elapsed_ms"`
}

func (c *Console) state(op string) State {
	st := State{Operator: op, At: time.Now().UTC(), Sessions: []engine.SessionInfo{}, Running: []RunView{}, Pending: c.cfg.Activity.Pending()}
	for _, call := range c.cfg.Activity.Running() {
		st.Running = append(st.Running, RunView{Call: call, ElapsedMS: time.Since(call.Started).Milliseconds()})
	}
	if c.cfg.Sessions != nil {
		st.Sessions = append(st.Sessions, c.cfg.Sessions.List()...)
		sort.Slice(st.Sessions, func(i, j int) bool { return st.Sessions[i].Created.Before(st.Sessions[j].Created) })
	}
	if c.cfg.Engine != nil {
		st.Queue, st.InFlight = c.cfg.Engine.Waiting(), c.cfg.Engine.Running()
	}
	st.Recent = c.cfg.Activity.RecentCalls(50)
	return st
}

func (c *Console) live(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	c.render(w, "live.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "State": c.state(s.operator), "Notice": r.URL.Query().Get("notice")})
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
	op := operator(r).operator
	for {
		data, _ := json.Marshal(c.state(op))
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
	a, err := c.cfg.Activity.Decide(id, approve, s.operator)
	if err != nil {
		c.back(w, r, "/console", err.Error())
		return
	}
	action := "decline"
	if approve {
		action = "approve"
	}
	c.record(s.operator, action, id, fmt.Sprintf("%s of %s", a.Tool, a.Identity))
	c.back(w, r, "/console", fmt.Sprintf("%sd %s of %s", action, a.Tool, a.Identity))
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

// back redirects to path with a notice shown there.
func (c *Console) back(w http.ResponseWriter, r *http.Request, path, notice string) {
	http.Redirect(w, r, path+"?notice="+urlQuery(cut(notice, 300)), http.StatusSeeOther)
}

func urlQuery(s string) string {
	var b strings.Builder
	for _, ch := range []byte(s) {
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '-', ch == '_', ch == '.':
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "%%%02X", ch)
		}
	}
	return b.String()
}

// filter is the audit browser's query.
type filter struct {
	Identity, Tool, Decision, Text string
	Since, Until                   time.Time
}

func (f filter) match(r *audit.Record) bool {
	switch {
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

type auditRow struct {
	*audit.Record
	Code string
}

func (c *Console) matches(f filter, limit int) ([]auditRow, int, error) {
	if c.cfg.AuditPath == "" {
		return nil, 0, fmt.Errorf("this server keeps no audit log (--audit-log)")
	}
	files, err := audit.Files(c.cfg.AuditPath)
	if err != nil {
		return nil, 0, err
	}
	var rows []auditRow
	total := 0
	err = audit.Read(files, func(r *audit.Record, _ string) bool {
		if !f.match(r) {
			return true
		}
		total++
		rows = append(rows, auditRow{Record: r, Code: codeOf(r.Arguments)})
		if len(rows) > limit {
			rows = rows[1:]
		}
		return true
	})
	// Newest first.
	for i, j := 0, len(rows)-1; i < j; i, j = i+1, j-1 {
		rows[i], rows[j] = rows[j], rows[i]
	}
	return rows, total, err
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
	rows, total, err := c.matches(f, maxAuditRows)
	data := map[string]any{"Op": s.operator, "CSRF": s.csrf, "Rows": rows, "Total": total, "F": f, "Query": r.URL.RawQuery,
		"Notice": r.URL.Query().Get("notice")}
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
	var rec *audit.Record
	var hash string
	audit.Read(files, func(r *audit.Record, h string) bool {
		if r.Seq == seq {
			rec, hash = r, h
			return false
		}
		return true
	})
	if rec == nil {
		http.NotFound(w, r)
		return
	}
	pretty, _ := json.MarshalIndent(rec, "", "  ")
	c.render(w, "record.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "R": rec, "Hash": hash, "Code": codeOf(rec.Arguments),
		"JSON": string(pretty)})
}

func (c *Console) auditDownload(w http.ResponseWriter, r *http.Request) {
	rows, _, err := c.matches(parseFilter(r), 100000)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", `attachment; filename="pysandbox-audit.jsonl"`)
	enc := json.NewEncoder(w)
	for i := len(rows) - 1; i >= 0; i-- {
		enc.Encode(rows[i].Record)
	}
}

func (c *Console) auditVerify(w http.ResponseWriter, r *http.Request) {
	notice := "this server keeps no audit log"
	if c.cfg.AuditPath != "" {
		files, err := audit.Files(c.cfg.AuditPath)
		if err == nil {
			var rep *audit.Report
			if rep, err = audit.Verify(files); err == nil {
				notice = fmt.Sprintf("the chain verifies: %d records (seq %d..%d) in %d files, head %s", rep.Records, rep.FirstSeq, rep.LastSeq, rep.Files, rep.Head)
			}
		}
		if err != nil {
			notice = "THE CHAIN DOES NOT VERIFY: " + err.Error()
		}
	}
	c.back(w, r, "/console/audit", notice)
}

func (c *Console) policyPage(w http.ResponseWriter, r *http.Request) {
	s := operator(r)
	pol := c.cfg.Policy()
	type rule struct{ Tool, Action, Limits string }
	var rules []rule
	for name, tr := range pol.Tools {
		var lim []string
		for _, l := range tr.Limits {
			lim = append(lim, l.String())
		}
		rules = append(rules, rule{name, string(tr.Action), strings.Join(lim, "; ")})
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].Tool < rules[j].Tool })
	c.render(w, "policy.html", map[string]any{"Op": s.operator, "CSRF": s.csrf, "P": pol, "Rules": rules})
}
