package pydist

import (
	"fmt"
	"sort"
	"strings"

	"github.com/pysandbox/pysandbox/internal/interp"
)

type held struct {
	version string
	release func()
}

// canHold refuses a new interpreter when the server runs on MaxHeld
// already.
func (m *Manager) canHold(key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.held[key]; ok || len(m.held) < m.cfg.MaxHeld {
		return nil
	}
	var vs []string
	for _, h := range m.held {
		vs = append(vs, h.version)
	}
	sort.Strings(vs)
	return &NotAvailableError{Msg: fmt.Sprintf("this server already runs on %d managed Pythons (%s), as many as it keeps at once; use one of them, or ask the operator (a restart frees them)", len(vs), strings.Join(vs, ", "))}
}

// hold marks an installed interpreter in use for the server's life.
func (m *Manager) hold(key string) (*interp.Interpreter, bool) {
	env, release, err := m.cfg.Cache.Acquire(key)
	if err != nil || env == nil {
		return nil, false
	}
	it, ok := interpreterOf(env)
	if !ok {
		release()
		return nil, false
	}
	m.mu.Lock()
	if _, dup := m.held[key]; dup {
		m.mu.Unlock()
		release()
	} else {
		m.held[key] = held{version: it.Version, release: release}
		m.mu.Unlock()
	}
	return it, true
}

// Close lets go of the interpreters in use: the cache may evict them.
func (m *Manager) Close() {
	m.mu.Lock()
	all := m.held
	m.held = map[string]held{}
	m.mu.Unlock()
	for _, h := range all {
		h.release()
	}
}
