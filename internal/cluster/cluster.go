// Package cluster lets several pysandbox replicas behind one address
// (a Kubernetes Service) serve as one: any replica accepts any request,
// and what belongs to one replica — an MCP session of the 2025-06-18
// (sessionful) protocol, a pysandbox session — is served by its owner.
//
// Ownership is written into the ids themselves: a replica's MCP session
// ids and pysandbox session ids end with its tag, NAME.INCARNATION, where
// NAME is the replica's stable name (the pod's) and INCARNATION is random
// per process. The replicas that run are listed in a directory in the
// shared store, each with the incarnation it runs and where it is
// reached, refreshed every second and gone three seconds after the last
// refresh. So a request for an id of a live replica goes there, and one
// for an id whose incarnation no longer runs (its replica stopped, or was
// restarted with empty memory) is answered at once: this session was lost
// when its server stopped.
//
// With snapshots (a state directory per replica: SetSnapshots), pysandbox
// sessions outlive their incarnation: a replica that stops hands its
// paused sessions to a live one and records where each went, and ids of
// incarnations that no longer run are routed by those records, then by
// their replica's name (handoff.go). MCP sessions still end with their
// incarnation.
//
// MCP sessions are routed at the HTTP level (Proxy): the whole request
// goes to the owner, authorization included, so the owner authenticates
// the caller itself. A tool call naming a pysandbox session of another
// replica is re-issued there (Forwarder) over the replicas' internal
// endpoint, with the caller's identity, after this replica's governance
// (policy, rate limits, approval, audit) decided it; the owner checks that
// the session belongs to that identity, so session privacy is decided by
// the owner.
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Member is a replica as the directory lists it.
type Member struct {
	Name        string `json:"name"`
	Incarnation string `json:"incarnation"`
	// MCP is the base URL of its public endpoint (http://10.0.0.5:8080),
	// Internal that of its internal one (http://10.0.0.5:8081).
	MCP      string `json:"mcp"`
	Internal string `json:"internal"`
	// Expires (Unix milliseconds) is when the entry stops being valid: a
	// replica re-signs it with each heartbeat, so an old entry written
	// back into the store is worthless.
	Expires int64 `json:"expires"`
	// Sig is an HMAC of the entry under the replicas' token: an entry
	// anyone else wrote into the store (to have requests, and the token
	// with them, sent to an address of theirs) is ignored.
	Sig string `json:"sig"`
}

func (m Member) mac(key []byte) string {
	h := hmac.New(sha256.New, key)
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%d", m.Name, m.Incarnation, m.MCP, m.Internal, m.Expires)
	return hex.EncodeToString(h.Sum(nil))
}

// signed is m signed to be valid until ttl from now (plus a few seconds
// for clocks that disagree).
func (m Member) signed(key []byte, ttl time.Duration) Member {
	m.Expires = time.Now().Add(ttl + clockSkew).UnixMilli()
	m.Sig = m.mac(key)
	return m
}

// clockSkew is how far replicas' clocks may disagree.
const clockSkew = 5 * time.Second

// valid reports whether m was written by a replica holding key, not long
// ago, with addresses a replica may have.
func (m Member) valid(key []byte) bool {
	if !hmac.Equal([]byte(m.Sig), []byte(m.mac(key))) || !name.MatchString(m.Name) || !incarnation.MatchString(m.Incarnation) ||
		time.Now().UnixMilli() > m.Expires {
		return false
	}
	for _, u := range []string{m.MCP, m.Internal} {
		p, err := url.Parse(u)
		if err != nil || p.Scheme != "http" || p.Host == "" || p.Path != "" || p.User != nil {
			return false
		}
	}
	return true
}

// Tag is the suffix of the ids the member owns.
func (m Member) Tag() string { return m.Name + "." + m.Incarnation }

// Directory is where replicas are listed (internal/sharedstate).
type Directory interface {
	// Register lists m until ttl from now; Deregister removes it now.
	Register(ctx context.Context, m Member, ttl time.Duration) error
	Deregister(ctx context.Context, m Member) error
	// Lookup finds a replica by name.
	Lookup(ctx context.Context, name string) (Member, bool, error)
	// Members lists the replicas listed now.
	Members(ctx context.Context) ([]Member, error)
	// Gone records that the incarnation tag left for good, with mark
	// (GoneMark, signed); WasGone returns the mark recorded for tag, ""
	// when there is none.
	Gone(ctx context.Context, tag, mark string) error
	WasGone(ctx context.Context, tag string) (mark string, err error)
	// HandOff records rec (a Handoff, signed) until ttl from now, in
	// place of any earlier record of its session; HandedTo returns the
	// record of session id, found false when there is none.
	HandOff(ctx context.Context, rec Handoff, ttl time.Duration) error
	HandedTo(ctx context.Context, id string) (rec Handoff, found bool, err error)
}

// Timing of the directory: a replica refreshes its entry every
// HeartbeatEvery, and an entry not refreshed for EntryTTL is gone.
const (
	HeartbeatEvery = time.Second
	EntryTTL       = 3 * time.Second
)

// name is what a replica may be called: a DNS label, as pod names are;
// incarnation is what Join makes.
var (
	name        = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	incarnation = regexp.MustCompile(`^[0-9a-f]{8}$`)
)

// MissingGrace is how long an owner may be missing from the directory
// before its sessions are taken for lost: a store that lost its data, or
// a replica that missed its heartbeats, comes back within it.
const MissingGrace = 5 * time.Second

// Cluster is this replica's membership.
type Cluster struct {
	self Member
	key  []byte // the replicas' token: signs directory entries
	dir  Directory
	log  *slog.Logger

	mu      sync.Mutex
	stopped bool
	stop    chan struct{}
	done    chan struct{}
	// missing notes since when an owner was not listed (by tag).
	missing map[string]time.Time
	// warned notes when a warning of each kind was last logged.
	warned map[string]time.Time
	// snapshots is set when paused sessions outlive their incarnation
	// (SetSnapshots); handed lists this incarnation's sessions handed to
	// another replica (by id: the holder's name).
	snapshots bool
	handed    map[string]string
	// routes are the live owners Route found lately (by their tag), each
	// remembered for routeFor.
	routes   map[string]route
	routeFor time.Duration
}

// route is a live owner as the store listed it, and when it was read.
type route struct {
	m  Member
	at time.Time
}

// Errors of Owner lookups.
var (
	// ErrLost: the id belongs to an incarnation that no longer runs.
	ErrLost = errors.New("this session was lost when its server stopped; create a new one")
	// ErrUnreachable: the owner is listed but could not be reached.
	ErrUnreachable = errors.New("the server holding this session did not answer; retry in a few seconds")
	// ErrBusy: the caller has as much forwarded as it may at once.
	ErrBusy = errors.New("too much of your work is in flight to other replicas")
)

// Join registers this replica and keeps it registered until Leave.
// name is its stable name; mcpURL and internalURL are where the others
// reach it.
func Join(ctx context.Context, dir Directory, replica, mcpURL, internalURL string, key []byte, log *slog.Logger) (*Cluster, error) {
	if !name.MatchString(replica) {
		return nil, fmt.Errorf("cluster: replica name %q: want a DNS label (lowercase letters, digits and -, as a pod's name)", replica)
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	c := &Cluster{
		self: Member{Name: replica, Incarnation: hex.EncodeToString(b[:]), MCP: strings.TrimRight(mcpURL, "/"), Internal: strings.TrimRight(internalURL, "/")},
		dir:  dir, log: log, stop: make(chan struct{}), done: make(chan struct{}), key: key, missing: map[string]time.Time{}, warned: map[string]time.Time{}, handed: map[string]string{},
		routes: map[string]route{}, routeFor: routeFor,
	}
	if !c.self.signed(key, EntryTTL).valid(key) {
		return nil, fmt.Errorf("cluster: %q is not an address the other replicas can reach this one at", internalURL)
	}
	if err := dir.Register(ctx, c.self.signed(key, EntryTTL), EntryTTL); err != nil {
		return nil, fmt.Errorf("cluster: register in the shared store: %w", err)
	}
	go c.heartbeat()
	return c, nil
}

// Self is this replica.
func (c *Cluster) Self() Member { return c.self }

func (c *Cluster) heartbeat() {
	defer close(c.done)
	t := time.NewTicker(HeartbeatEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), HeartbeatEvery)
		err := c.dir.Register(ctx, c.self.signed(c.key, EntryTTL), EntryTTL)
		cancel()
		switch {
		case err != nil && !failing:
			c.log.Warn("cluster: cannot refresh this replica's entry in the shared store; others will take its sessions for lost", "err", err)
		case err == nil && failing:
			c.log.Info("cluster: this replica's entry is refreshed again")
		}
		failing = err != nil
	}
}

// Leave removes this replica from the directory: its sessions are lost to
// the others from now on.
func (c *Cluster) Leave() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	c.mu.Unlock()
	close(c.stop)
	<-c.done
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Its sessions are lost from now on, at once, not after a grace.
	c.dir.Gone(ctx, c.self.Tag(), GoneMark(c.key, c.self.Tag()))
	c.dir.Deregister(ctx, c.self)
}

// NewMCPSessionID is an MCP session id this replica owns.
func (c *Cluster) NewMCPSessionID() string {
	return c.self.Tag() + "." + rand.Text()
}

// SessionSuffix ends the pysandbox session ids this replica makes.
func (c *Cluster) SessionSuffix() string { return "." + c.self.Tag() }

// tagOf splits the owner's name and incarnation off an id made by
// NewMCPSessionID or ending in SessionSuffix; ok is false for an id that
// names no owner (one a single server made).
func tagOf(id string, mcp bool) (name, inc string, ok bool) {
	parts := strings.Split(id, ".")
	if mcp {
		if len(parts) != 3 {
			return "", "", false
		}
		return parts[0], parts[1], true
	}
	if len(parts) != 3 {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// Owner says who owns an id: local when this replica does (or the id
// names no owner), else the live member, or ErrLost. An owner that is not
// listed is lost once it left for good, or has been missing for
// MissingGrace; until then the answer is to retry. With snapshots
// (SetSnapshots), a pysandbox session outlives its incarnation: see
// pausedOwner.
func (c *Cluster) Owner(ctx context.Context, id string, mcpSession bool) (m Member, local bool, err error) {
	name, inc, ok := tagOf(id, mcpSession)
	paused := !mcpSession && c.snapshotsOn()
	if !ok || name == c.self.Name && inc == c.self.Incarnation {
		if paused {
			// One of its own sessions this replica handed over as it stops.
			c.mu.Lock()
			holder := c.handed[id]
			c.mu.Unlock()
			if ok && holder != "" {
				return c.holderOf(ctx, holder)
			}
		}
		return c.self, true, nil
	}
	if !incarnation.MatchString(inc) || !nameOK(name) {
		// Not an id any replica made.
		return Member{}, false, ErrLost
	}
	if paused {
		return c.pausedOwner(ctx, id, name, inc)
	}
	if name == c.self.Name {
		// An earlier incarnation of this very replica.
		return Member{}, false, ErrLost
	}
	m, found, err := c.lookup(ctx, name)
	if err != nil {
		return Member{}, false, err
	}
	tag := name + "." + inc
	if found && m.Incarnation != inc {
		return Member{}, false, ErrLost
	}
	// An incarnation that left for good stays lost, whatever the
	// directory says (an old entry written back).
	if c.left(ctx, tag) {
		return Member{}, false, ErrLost
	}
	if found {
		c.mu.Lock()
		delete(c.missing, tag)
		c.mu.Unlock()
		return m, false, nil
	}
	return Member{}, false, c.missingFor(tag)
}

// Bounds of Route's memory: an owner found live is taken as live for
// routeFor without asking the store again (its heartbeat's period). Only
// owners listed live are remembered, one entry each, so made-up ids add
// none; maxRoutes bounds it whatever the store lists.
const (
	routeFor  = HeartbeatEvery
	maxRoutes = 256
)

// Route is Owner for a call on pysandbox session id that is made at once,
// without the store's two round trips for each call: an owner the store
// listed live, under the incarnation that made id and not gone, is
// remembered for routeFor and answered from memory, its entry verified
// again (signature and expiry). Only where a session is sent is
// remembered, by owner, never by session or caller: whether the session is
// the caller's is decided by the owner, for each call. Every other answer
// (this replica's, a handoff, another incarnation, lost, missing) is
// Owner's, asked each time.
//
// An owner that leaves within routeFor still gets calls from memory; it
// closes its internal endpoint before it leaves, so they fail as
// unreachable, and the caller is told to retry (Unroute makes the next
// call ask the store).
func (c *Cluster) Route(ctx context.Context, id string) (m Member, local bool, err error) {
	name, inc, ok := tagOf(id, false)
	tag := name + "." + inc
	if !ok || tag == c.self.Tag() {
		return c.Owner(ctx, id, false)
	}
	c.mu.Lock()
	r, found := c.routes[tag]
	fresh := found && time.Since(r.at) < c.routeFor
	c.mu.Unlock()
	if fresh && r.m.valid(c.key) {
		return r.m, false, nil
	}
	now := time.Now()
	m, local, err = c.Owner(ctx, id, false)
	if err == nil && !local && m.Tag() == tag {
		c.remember(tag, m, now)
	}
	return m, local, err
}

// remember notes m, read at, as the live owner of tag.
func (c *Cluster) remember(tag string, m Member, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, found := c.routes[tag]; !found && len(c.routes) >= maxRoutes {
		// Forget the stale first, else the oldest.
		var oldest string
		for k, r := range c.routes {
			if time.Since(r.at) >= c.routeFor {
				delete(c.routes, k)
				continue
			}
			if oldest == "" || r.at.Before(c.routes[oldest].at) {
				oldest = k
			}
		}
		if len(c.routes) >= maxRoutes {
			delete(c.routes, oldest)
		}
	}
	c.routes[tag] = route{m: m, at: at}
}

// Serves reports whether this replica is where calls on its session id
// are made: not once it began to leave, nor for a session it handed to
// another as it stops. A replica that routed a call here from memory
// (Route), or looked the owner up a moment before, is then answered so,
// rather than served a session that is another's now.
func (c *Cluster) Serves(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stopped && c.handed[id] == ""
}

// Unroute forgets the route to m: a call sent there failed, and the next
// asks the store.
func (c *Cluster) Unroute(m Member) {
	c.mu.Lock()
	delete(c.routes, m.Tag())
	c.mu.Unlock()
}

// missingFor is the answer for an owner tag that is not listed: retry
// until it has been missing for MissingGrace, lost after.
func (c *Cluster) missingFor(tag string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	since, seen := c.missing[tag]
	if !seen {
		if len(c.missing) >= maxMissing {
			// Forget the oldest: a flood of made-up ids costs a bounded map.
			var oldest string
			for k, t := range c.missing {
				if oldest == "" || t.Before(c.missing[oldest]) {
					oldest = k
				}
			}
			delete(c.missing, oldest)
		}
		since = time.Now()
		c.missing[tag] = since
	}
	if time.Since(since) >= MissingGrace {
		return ErrLost
	}
	return ErrUnreachable
}

// maxMissing bounds the owners remembered as missing.
const maxMissing = 256

func nameOK(n string) bool { return len(n) <= 63 && name.MatchString(n) }

// Members lists the live replicas, this one included (entries not signed
// with the replicas' token are left out).
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	all, err := c.dir.Members(ctx)
	var out []Member
	seen := map[string]bool{}
	for _, m := range all {
		// One entry per incarnation: copies of an entry under other names
		// are not replicas.
		if m.valid(c.key) && !seen[m.Tag()] {
			seen[m.Tag()] = true
			out = append(out, m)
		}
	}
	return out, err
}
