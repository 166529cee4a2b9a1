package cluster

import "time"

// SignHandoff signs h as a replica with key would, for tests that write
// records of their own into the store.
func SignHandoff(key []byte, h Handoff) Handoff {
	h.Sig = h.mac(key)
	return h
}

// SignMember signs m as a live replica holding key would, for ttl.
func SignMember(key []byte, m Member, ttl time.Duration) Member { return m.signed(key, ttl) }

// MaxRoutes is how many owners Route remembers at most.
const MaxRoutes = maxRoutes

// Routes is how many owners c remembers.
func (c *Cluster) Routes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.routes)
}

// RouteFor sets how long c takes an owner it found live for live, for a
// test that must not depend on how fast the machine is.
func (c *Cluster) RouteFor(d time.Duration) {
	c.mu.Lock()
	c.routeFor = d
	c.mu.Unlock()
}
