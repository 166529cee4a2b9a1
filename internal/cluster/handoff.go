package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// Handoff records: with snapshots (a state directory per replica), a
// session outlives the incarnation that made it. A replica that stops
// pauses its sessions and hands their snapshots to a live replica
// (internal/cli); for each it records in the store which replica holds it
// now, so that an id whose incarnation no longer runs is routed there
// instead of being answered "lost". A session it could not hand over stays
// on its own volume, recorded as held by its own name: it is served again
// when the replica comes back.
//
// Anyone who can write the store could otherwise route a session's calls,
// with the caller's identity, to another replica (one that answers
// "unknown session"): a record is an HMAC under the replicas' token, with
// its own domain, as gone markers are, and one without it is ignored. A
// genuine record can only name a replica that is listed, signed, in the
// directory, so no call ever goes to an address a record gives. A genuine
// but older record written back can misroute a session until its expiry;
// it cannot send anything outside the replicas.

// handoffDomain starts what a handoff record's HMAC covers, so that no
// other record signed with the replicas' token passes for one.
const handoffDomain = "pysandbox handoff record v1\n"

// Handoff says that the replica named Holder holds session Session's
// snapshot (or the session itself, once resumed there).
type Handoff struct {
	Session string `json:"session"`
	Holder  string `json:"holder"`
	// Expires (Unix milliseconds) bounds how long a copy of the record
	// written back stays good.
	Expires int64  `json:"expires"`
	Sig     string `json:"sig"`
}

func (h Handoff) mac(key []byte) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s%s\x00%s\x00%d", handoffDomain, h.Session, h.Holder, h.Expires)
	return hex.EncodeToString(m.Sum(nil))
}

// valid reports whether h is a record a replica holding key wrote for
// session id, not expired.
func (h Handoff) valid(key []byte, id string) bool {
	return h.Session == id && nameOK(h.Holder) && time.Now().UnixMilli() <= h.Expires && hmac.Equal([]byte(h.Sig), []byte(h.mac(key)))
}

// SetSnapshots says whether this replica keeps paused sessions (a state
// directory): only then are ids of incarnations that no longer run routed
// by handoff records and by name. Without, such ids are lost, as before.
func (c *Cluster) SetSnapshots(on bool) {
	c.mu.Lock()
	c.snapshots = on
	c.mu.Unlock()
}

func (c *Cluster) snapshotsOn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshots
}

// RecordHandoff records in the store that the replica named holder
// holds session id from now on, for ttl (about the time a paused session
// is kept). Other replicas follow it once this replica's incarnation no
// longer runs.
func (c *Cluster) RecordHandoff(ctx context.Context, id, holder string, ttl time.Duration) error {
	if !nameOK(holder) {
		return fmt.Errorf("cluster: %q is not a replica's name", holder)
	}
	rec := Handoff{Session: id, Holder: holder, Expires: time.Now().Add(ttl + clockSkew).UnixMilli()}
	rec.Sig = rec.mac(c.key)
	if err := c.dir.HandOff(ctx, rec, ttl+clockSkew); err != nil {
		return fmt.Errorf("cluster: record where session %s went: %w", id, err)
	}
	return nil
}

// HandedOver has this replica send the calls on session id, one of its
// own it handed over, to the replica named holder, which has it now (the
// others still send them here while this incarnation runs).
func (c *Cluster) HandedOver(id, holder string) {
	c.mu.Lock()
	c.handed[id] = holder
	c.mu.Unlock()
}

// handedTo is the holder the store records for session id, "" when there
// is no genuine record.
func (c *Cluster) handedTo(ctx context.Context, id string) (string, error) {
	rec, found, err := c.dir.HandedTo(ctx, id)
	if err != nil || !found {
		return "", err
	}
	if !rec.valid(c.key, id) {
		c.warn("handoff", "cluster: a handoff record not signed with the replicas' token, or expired, is ignored (someone who can write the shared store wrote it)", "session", id)
		return "", nil
	}
	return rec.Holder, nil
}

// lookup finds the replica listed under name, its entry verified.
func (c *Cluster) lookup(ctx context.Context, name string) (Member, bool, error) {
	m, found, err := c.dir.Lookup(ctx, name)
	if err != nil {
		return Member{}, false, fmt.Errorf("the shared store did not answer where this session is (%v); retry in a few seconds", err)
	}
	if found && (!m.valid(c.key) || m.Name != name) {
		c.warn("entry", "cluster: a directory entry not signed with the replicas' token, or expired, is ignored", "name", name)
		found = false
	}
	return m, found, nil
}

// holderOf routes to the replica named holder: local when it is this one,
// to be retried when it does not run now (its volume keeps the session
// until it comes back).
func (c *Cluster) holderOf(ctx context.Context, holder string) (Member, bool, error) {
	if holder == c.self.Name {
		return c.self, true, nil
	}
	m, found, err := c.lookup(ctx, holder)
	switch {
	case err != nil:
		return Member{}, false, err
	case !found:
		return Member{}, false, ErrUnreachable
	}
	return m, false, nil
}

// pausedOwner is Owner for a pysandbox session when sessions outlive
// their incarnation. In order: the incarnation that made it, while it
// runs; the replica a handoff record names; this replica, for an id of an
// earlier incarnation of its own (its volume may hold the snapshot; the
// engine says "unknown session" if not); the replica of the id's name
// under another incarnation (restarted with its volume); else, as
// without snapshots, lost once it left or has been missing long enough.
func (c *Cluster) pausedOwner(ctx context.Context, id, name, inc string) (Member, bool, error) {
	tag := name + "." + inc
	var m Member
	found := false
	if name != c.self.Name {
		var err error
		if m, found, err = c.lookup(ctx, name); err != nil {
			return Member{}, false, err
		}
	}
	left := c.left(ctx, tag)
	if found && m.Incarnation == inc && !left {
		c.mu.Lock()
		delete(c.missing, tag)
		c.mu.Unlock()
		return m, false, nil
	}
	holder, err := c.handedTo(ctx, id)
	if err != nil {
		return Member{}, false, fmt.Errorf("the shared store did not answer where this session is (%v); retry in a few seconds", err)
	}
	switch {
	case holder != "":
		return c.holderOf(ctx, holder)
	case name == c.self.Name:
		return c.self, true, nil
	case found && m.Incarnation != inc:
		return m, false, nil
	case left:
		return Member{}, false, ErrLost
	}
	return Member{}, false, c.missingFor(tag)
}
