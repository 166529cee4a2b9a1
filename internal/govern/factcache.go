package govern

import (
	"container/list"
	"crypto/sha256"
	"strings"
	"sync"
	"time"
)

// Bounds of the code facts cache (Config.FactsCache).
const (
	// factsCacheBytes bounds the memory of all entries together, and
	// maxFactsEntryBytes one entry's: the facts of a large program (their
	// lists hold up to about 100 KiB) are derived again instead of kept.
	factsCacheBytes    = 4 << 20
	maxFactsEntryBytes = 16 << 10
	// factsCacheTTL bounds how long facts are trusted without a parser
	// looking again: an interpreter may be replaced meanwhile (a managed
	// Python updated), whose parser could say otherwise.
	factsCacheTTL = 10 * time.Minute
)

// factKey is what a program's facts are a function of, and who may reuse
// them: the caller, the interpreter the code would run on (the version
// asked for; the code's own requires-python is part of the code), and
// the code itself, by SHA-256.
type factKey struct {
	identity, python string
	code             [sha256.Size]byte
}

func newFactKey(identity, python, code string) factKey {
	return factKey{identity: identity, python: python, code: sha256.Sum256([]byte(code))}
}

// factsCache keeps the code facts of recent calls, per caller, so that the
// same code sent again is decided on the facts Python's parser gave for it
// before instead of parsing it again: a run then needs no gate in its
// sandbox. Only facts from a parser in a sandbox no code had run in are
// put in (see Ticket.Check); decisions are never kept, since they depend
// on the policy, the limits and the arguments, which change.
//
// Entries are per identity: facts are a function of the code alone, but
// one caller's hit would tell another that someone sent that code. So an
// identity that stands for callers the server cannot tell apart (Call.
// Shared) has none. It
// holds at most max entries and factsCacheBytes in all, least recently
// used first out, each for at most factsCacheTTL. What it returns is a
// copy: nothing a caller does with it changes what the next one gets.
type factsCache struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	bytes   int
	order   *list.List // of *factEntry, most recently used first
	entries map[factKey]*list.Element
}

type factEntry struct {
	key     factKey
	facts   map[string]any
	summary string
	size    int
	expires time.Time
}

// newFactsCache returns a cache of at most max entries; nil (no cache)
// when max <= 0. Every method of a nil cache is a no-op.
func newFactsCache(max int) *factsCache {
	if max <= 0 {
		return nil
	}
	return &factsCache{max: max, ttl: factsCacheTTL, now: time.Now, order: list.New(), entries: map[factKey]*list.Element{}}
}

// get returns a copy of the facts kept for k and their summary.
func (c *factsCache) get(k factKey) (map[string]any, string, bool) {
	if c == nil {
		return nil, "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil, "", false
	}
	e := el.Value.(*factEntry)
	if !c.now().Before(e.expires) {
		c.remove(el)
		return nil, "", false
	}
	c.order.MoveToFront(el)
	return cloneValue(e.facts).(map[string]any), e.summary, true
}

// put keeps a copy of facts for k, unless they may not say the same the
// next time (the analysis gave up: "unanalysable", which a lack of
// memory or of a process can cause) or are too large to keep.
func (c *factsCache) put(k factKey, facts map[string]any, summary string) {
	if c == nil || facts == nil || unanalysable(facts) {
		return
	}
	size := len(k.identity) + len(k.python) + len(k.code) + len(summary) + sizeOf(facts) + 128
	if size > maxFactsEntryBytes {
		return
	}
	e := &factEntry{key: k, facts: cloneValue(facts).(map[string]any), summary: summary, size: size, expires: c.now().Add(c.ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		c.remove(el)
	}
	c.entries[k] = c.order.PushFront(e)
	c.bytes += size
	for c.order.Len() > c.max || c.bytes > factsCacheBytes {
		c.remove(c.order.Back())
	}
}

func (c *factsCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*factEntry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

// len and size are the entries kept and their bytes (for tests).
func (c *factsCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

func (c *factsCache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// unanalysable says the parser gave up on the code, or the analysis
// failed: such facts are derived again next time.
func unanalysable(facts map[string]any) bool {
	dyn, _ := facts["dynamic_code"].([]any)
	for _, d := range dyn {
		if s, _ := d.(string); strings.HasPrefix(s, "unanalysable") {
			return true
		}
	}
	return false
}

// sizeOf estimates the memory of a JSON value as the facts hold them.
func sizeOf(v any) int {
	switch v := v.(type) {
	case string:
		return 16 + len(v)
	case []string:
		n := 24
		for _, x := range v {
			n += 16 + len(x)
		}
		return n
	case []any:
		n := 24
		for _, x := range v {
			n += 16 + sizeOf(x)
		}
		return n
	case map[string]any:
		n := 48
		for k, x := range v {
			n += 16 + len(k) + 16 + sizeOf(x)
		}
		return n
	default:
		return 16
	}
}

// cloneValue copies the maps and slices of a JSON value (its strings,
// numbers and booleans are immutable).
func cloneValue(v any) any {
	switch v := v.(type) {
	case []string:
		return append([]string(nil), v...)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = cloneValue(x)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = cloneValue(x)
		}
		return out
	default:
		return v
	}
}
