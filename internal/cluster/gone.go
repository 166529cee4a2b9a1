package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Gone markers: a replica that stops cleanly marks its incarnation gone
// in the store, so that the others answer "lost" for its sessions at once
// rather than after MissingGrace. Anyone who can write the store could
// otherwise write one for a live replica, and have its sessions answer
// "lost" through every other replica: so a marker is an HMAC under the
// replicas' token, as directory entries are, and one without it is
// ignored.

// goneDomain starts what a gone marker's HMAC covers, so that no other
// record signed with the replicas' token (a directory entry, whose HMAC
// starts with a replica's name and a zero byte) can pass for one.
const goneDomain = "pysandbox gone marker v1\n"

// GoneMark is the mark that says, under key (the replicas' token), that
// the incarnation tag left for good. A genuine marker written back later
// says nothing new: an incarnation never comes back.
func GoneMark(key []byte, tag string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(goneDomain + tag))
	return hex.EncodeToString(h.Sum(nil))
}

// left reports whether the incarnation tag left for good, as a marker
// only a replica could have written says; a forged one is logged and
// ignored. A store that does not answer says nothing: the directory
// lookup before decides.
func (c *Cluster) left(ctx context.Context, tag string) bool {
	mark, err := c.dir.WasGone(ctx, tag)
	if err != nil || mark == "" {
		return false
	}
	if hmac.Equal([]byte(mark), []byte(GoneMark(c.key, tag))) {
		return true
	}
	c.warn("gone", "cluster: a gone marker not signed with the replicas' token is ignored (someone who can write the shared store wrote it)", "replica", tag)
	return false
}

// warnEvery spaces the warnings of one kind: whoever can write the store
// can have every request meet a forged record, and the log should not
// grow with them.
const warnEvery = time.Minute

// warn logs a warning of kind what, unless one was logged in the last
// warnEvery.
func (c *Cluster) warn(what, msg string, args ...any) {
	c.mu.Lock()
	last, seen := c.warned[what]
	now := time.Now()
	if seen && now.Sub(last) < warnEvery {
		c.mu.Unlock()
		return
	}
	c.warned[what] = now
	c.mu.Unlock()
	c.log.Warn(msg, args...)
}
