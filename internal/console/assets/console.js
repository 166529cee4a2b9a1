// The live view: the server pushes its state (Server-Sent Events) and this
// renders it. Everything an agent wrote is set with textContent, never as
// markup.
"use strict";
(function () {
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function secs(ms) {
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
    return Math.floor(ms / 60000) + "m" + String(Math.floor(ms / 1000) % 60).padStart(2, "0") + "s";
  }
  function mib(b) { return (b / 1048576).toFixed(1) + " MiB"; }
  function ago(iso) {
    const ms = Date.now() - Date.parse(iso);
    if (isNaN(ms)) return "";
    return ms < 1000 ? "just now" : secs(Math.round(ms / 1000) * 1000) + " ago";
  }
  // seg is a value as one segment of a URL path, as the server's seg
  // (console.go) makes it: encodeURIComponent leaves "." alone, and a
  // value of dots alone would climb the path.
  function seg(v) {
    const s = String(v);
    if (/^\.*$/.test(s)) return "-";
    return encodeURIComponent(s).replace(/[.!'()*~]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
  }
  function killForm(id, csrf, path, label, danger, aria) {
    const f = document.createElement("form");
    f.method = "post";
    f.action = path.replace("{id}", seg(id));
    const h = hidden("csrf", csrf);
    const b = el("button", label, danger ? "danger" : "");
    b.type = "submit";
    if (aria) b.setAttribute("aria-label", aria);
    f.append(h, b);
    return f;
  }
  function rows(tbody, items, cols, empty) {
    const frag = document.createDocumentFragment();
    if (items.length === 0) {
      const tr = el("tr", null, "empty");
      const td = el("td", empty);
      td.colSpan = cols;
      tr.append(td);
      frag.append(tr);
    }
    return frag;
  }
  function hidden(name, value) {
    const h = document.createElement("input");
    h.type = "hidden"; h.name = name; h.value = value;
    return h;
  }
  let pendingKey = null;
  function render(state, csrf) {
    const pending = document.getElementById("pending");
    // Rebuilt only when the set of waiting calls changes, so a button
    // never moves under the operator's pointer as times tick.
    const key = state.pending.map((a) => a.id + ":" + a.digest).join(",");
    if (key !== pendingKey) {
      pendingKey = key;
      const pf = rows(pending, state.pending, 5, "No call waits for an operator.");
      for (const a of state.pending) {
        const tr = el("tr"); tr.dataset.id = a.id;
        const what = el("td");
        what.append(el("pre", a.facts, "facts"));
        if (a.code) what.append(el("pre", a.code, "code"));
        if (a.detail_bytes) what.append(el("p", "Values of " + a.detail_bytes + " bytes (inputs or other arguments) that the code or tool uses: review them.", "warn"));
        if (a.controls) what.append(el("p", "Control or invisible characters in the code (shown as escapes): Python may read a line break or an indentation reset where none shows.", "warn"));
        if (a.non_ascii && a.non_ascii.length) {
          const w = el("p", "Non-ASCII characters: ", "warn");
          for (const c of a.non_ascii) { w.append(el("code", c), " "); }
          what.append(w);
        }
        const meta = el("p", "arguments sha256 ", "meta");
        meta.append(el("code", String(a.digest).slice(0, 16)), a.code_bytes ? " · " + a.code_bytes + " bytes of code" : "");
        what.append(meta);
        const waited = el("td", ago(a.created)); waited.dataset.since = a.created;
        const act = el("td");
        if (!a.inline) {
          const link = el("a", "Review to approve", "button");
          link.href = "/console/approvals/" + seg(a.id);
          act.append(link);
        } else {
          const f = killForm(a.id, csrf, "/console/approvals/{id}/approve", "Approve", false, "Approve the call of " + a.identity);
          f.append(hidden("digest", a.digest));
          act.append(f);
        }
        act.append(killForm(a.id, csrf, "/console/approvals/{id}/decline", "Decline", true, "Decline the call of " + a.identity));
        tr.append(el("td", a.identity), el("td", a.tool), what, waited, act);
        pf.append(tr);
      }
      pending.replaceChildren(pf);
    } else {
      for (const td of pending.querySelectorAll("td[data-since]")) td.textContent = ago(td.dataset.since);
    }
    document.getElementById("n-pending").textContent = state.pending_total;
    const runs = document.getElementById("runs");
    const rf = rows(runs, state.running, 7, "Nothing is running.");
    for (const r of state.running) {
      const tr = el("tr"); tr.dataset.id = r.id;
      const tool = el("td", r.tool);
      if (r.session) { tool.append(el("br"), el("small", r.session)); }
      const code = el("td"); code.append(el("pre", r.code, "code"));
      const act = el("td"); act.append(killForm(r.id, csrf, "/console/runs/{id}/kill", "Kill", true, "Kill the run of " + r.identity));
      if (r.session) act.append(killForm(r.session, csrf, "/console/sessions/{id}/close", "Close session", false, "Close session " + r.session + " and every process in it"));
      tr.append(el("td", r.identity), tool, code, el("td", secs(r.elapsed_ms)),
        el("td", r.has_usage ? secs(r.cpu_ms) : "—"), el("td", r.has_usage ? mib(r.memory_bytes) : "—"), act);
      rf.append(tr);
    }
    runs.replaceChildren(rf);
    document.getElementById("n-runs").textContent = state.running_total;
    document.getElementById("queue").textContent = state.queue;
    document.getElementById("inflight").textContent = state.in_flight;
    const sessions = document.getElementById("sessions");
    const sf = rows(sessions, state.sessions, 8, "No session is open.");
    for (const s of state.sessions) {
      const tr = el("tr"); tr.dataset.id = s.session_id;
      const id = el("td"); id.append(el("code", s.session_id));
      const act = el("td"); act.append(killForm(s.session_id, csrf, "/console/sessions/{id}/close", "Close", false, "Close session " + s.session_id));
      tr.append(id, el("td", s.owner), el("td", secs(s.age_s * 1000)), el("td", s.runs), el("td", secs(s.cpu_time_ms)),
        el("td", mib(s.memory_bytes)), el("td", ago(s.last_used)), act);
      sf.append(tr);
    }
    sessions.replaceChildren(sf);
    document.getElementById("n-sessions").textContent = state.sessions.length;
    const recent = document.getElementById("recent");
    const cf = rows(recent, state.recent, 6, "No call yet.");
    for (const c of state.recent) {
      const tr = el("tr");
      const d = el("td"); d.append(el("span", c.decision, "tag d-" + String(c.decision).replace(/[^a-z_]/g, "")));
      tr.append(el("td", ago(c.at)), el("td", c.identity), el("td", c.tool), d, el("td", c.status || ""), el("td", secs(c.duration_ms)));
      cf.append(tr);
    }
    recent.replaceChildren(cf);
  }
  const live = document.getElementById("live");
  if (live) {
    const csrf = live.dataset.csrf;
    const status = document.getElementById("live-state");
    const es = new EventSource("/console/events");
    es.addEventListener("state", (ev) => { render(JSON.parse(ev.data), csrf); status.textContent = "updated " + new Date().toLocaleTimeString(); });
    es.onerror = () => { status.textContent = "reconnecting…"; };
  }
  // Python keywords, strings and comments, by token: the code stays text.
  for (const pre of document.querySelectorAll("pre.highlight")) {
    const src = pre.textContent;
    const re = /(#[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\[\s\S]|[^"\\\n])*"|'(?:\\[\s\S]|[^'\\\n])*')|\b(and|as|assert|async|await|break|class|continue|def|del|elif|else|except|finally|for|from|global|if|import|in|is|lambda|nonlocal|not|or|pass|raise|return|try|while|with|yield|None|True|False)\b/g;
    const frag = document.createDocumentFragment();
    let last = 0, m;
    while ((m = re.exec(src)) !== null) {
      frag.append(document.createTextNode(src.slice(last, m.index)));
      frag.append(el("span", m[0], m[1] ? "com" : m[2] ? "str" : "kw"));
      last = re.lastIndex;
    }
    frag.append(document.createTextNode(src.slice(last)));
    pre.replaceChildren(frag);
  }
})();
