package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
)

// Anchor is a chain's head as it was written somewhere else (the shared
// store of several replicas): a later chain must still hold the record of
// that seq, with that hash. A chain cut short, or rewritten from an
// earlier point, does not.
//
// In the shared store, anyone who can write it could put a shorter head
// there, or delete the anchor, and a cut chain would pass; so an anchor is
// signed with the replicas' token, over the replica it belongs to, and
// names the replicas whose anchors its replica had seen: an anchor deleted
// is still named by the others'.
type Anchor struct {
	Seq  int64  `json:"seq"`
	Head string `json:"head"`
	// Replicas are the replicas known to have anchored a chain when this
	// anchor was written, its own included (sorted).
	Replicas []string `json:"replicas,omitempty"`
	// Sig is an HMAC-SHA256 of the rest, and of the replica's name, under
	// the replicas' token (hex).
	Sig string `json:"sig,omitempty"`
}

// Expect is what a chain must hold to match the anchor.
func (a Anchor) Expect() Expect { return Expect{Head: a.Head, HeadSeq: a.Seq} }

// anchorDomain starts what an anchor's HMAC covers, so that no other
// record signed with the same token (a directory entry, a gone marker)
// can pass for an anchor.
const anchorDomain = "pysandbox audit anchor v1\n"

func (a Anchor) mac(replica string, key []byte) string {
	body, _ := json.Marshal(struct {
		Replica  string   `json:"replica"`
		Seq      int64    `json:"seq"`
		Head     string   `json:"head"`
		Replicas []string `json:"replicas"`
	}{replica, a.Seq, a.Head, a.Replicas})
	h := hmac.New(sha256.New, key)
	h.Write([]byte(anchorDomain))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Sign returns a signed for replica with key (the replicas' token), its
// replica list sorted and including replica.
func (a Anchor) Sign(replica string, key []byte) Anchor {
	a.Replicas = slices.Clone(a.Replicas)
	if !slices.Contains(a.Replicas, replica) {
		a.Replicas = append(a.Replicas, replica)
	}
	slices.Sort(a.Replicas)
	a.Replicas = slices.Compact(a.Replicas)
	a.Sig = a.mac(replica, key)
	return a
}

// Errors of Anchor.Check.
var (
	ErrUnsigned = errors.New("the anchor is not signed (written by anyone who can write the store, or by a version before anchors were signed)")
	ErrForged   = errors.New("the anchor's signature does not match: it was altered, copied from another replica, or signed with another token")
)

// Check reports whether a was signed for replica with key.
func (a Anchor) Check(replica string, key []byte) error {
	switch {
	case a.Sig == "":
		return ErrUnsigned
	case !hmac.Equal([]byte(a.Sig), []byte(a.mac(replica, key))):
		return ErrForged
	case a.Seq < 1 || !isLowerHex(a.Head):
		// Signed, but not a head any writer has: only a bug writes this.
		return errors.New("the anchor is malformed: want seq 1 or more and a SHA-256 head")
	}
	return nil
}
