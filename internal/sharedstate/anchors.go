package sharedstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/audit"
)

// Audit anchors: each replica writes the head of its audit chain here,
// now and then and when it stops, so that `pysandbox audit verify
// --store` can tell a chain cut short (or lost with its volume) from a
// whole one. An anchor only moves forward.
//
// Whoever can write the store could otherwise put a shorter head in place
// of a replica's, or delete it, and a chain cut to match would pass: so
// each anchor is signed with the replicas' token (audit.Anchor.Sign) and
// names every replica whose anchor its own had seen, so that an anchor
// deleted is still named by the others'.

func (s *Store) anchorsKey() string { return s.prefix + "audit-anchors" }

// anchorCAS sets a replica's anchor if the one there is still the one the
// replica read (ARGV[2], "" for none): the decision to replace it, made
// after checking its signature, holds only for that value.
var anchorCAS = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
`)

// UseReplicaKey gives the store the replicas' token, which signs the
// audit anchors (SetAnchor) and checks them (Anchors).
func (s *Store) UseReplicaKey(key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = slices.Clone(key)
}

// replicaKey is the key UseReplicaKey gave, or an error without one: an
// anchor nobody can check proves nothing.
func (s *Store) replicaKey() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.key) == 0 {
		return nil, errors.New("sharedstate: no replicas' token to sign and check audit anchors with")
	}
	return s.key, nil
}

// SetAnchor records replica's chain head a, signed with the replicas'
// token (UseReplicaKey). An anchor there that is signed and later (or of
// the same seq) stays, with the replicas known since added; one that is
// not signed with the token is replaced, with a warning.
func (s *Store) SetAnchor(ctx context.Context, replica string, a audit.Anchor) error {
	key, err := s.replicaKey()
	if err != nil {
		return err
	}
	// Another writer between the read and the write (only someone
	// forging, as a replica is its name's only writer) makes it read again.
	for range 3 {
		all, err := s.c.HGetAll(ctx, s.anchorsKey()).Result()
		if err != nil {
			return err
		}
		cur, had := all[replica]
		known := s.knownReplicas(replica, all, key)
		next := audit.Anchor{Seq: a.Seq, Head: a.Head, Replicas: known}
		var old audit.Anchor
		if had {
			if err := json.Unmarshal([]byte(cur), &old); err == nil && old.Check(replica, key) == nil {
				if old.Seq >= a.Seq {
					// Never back: a chain that lost records (its volume
					// lost) must keep failing against its old anchor.
					next.Seq, next.Head = old.Seq, old.Head
				}
			} else {
				slog.Warn("sharedstate: this replica's audit anchor in the store is not signed with the replicas' token; replacing it", "replica", replica)
			}
		}
		next = next.Sign(replica, key)
		if had && next.Sig == old.Sig {
			return nil
		}
		data, err := json.Marshal(next)
		if err != nil {
			return err
		}
		ok, err := anchorCAS.Run(ctx, s.c, []string{s.anchorsKey()}, replica, cur, data).Int()
		if err != nil || ok == 1 {
			return err
		}
	}
	return fmt.Errorf("the audit anchor of %s kept changing in the store while it was written: someone else writes it", replica)
}

// knownReplicas are the replicas this one knows have anchored: those
// whose anchors in all are signed, the ones those name, and every one
// this process saw before (kept, so that an anchor deleted from the store
// stays named by this replica's).
func (s *Store) knownReplicas(self string, all map[string]string, key []byte) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = map[string]bool{}
	}
	s.known[self] = true
	for name, v := range all {
		var a audit.Anchor
		if json.Unmarshal([]byte(v), &a) == nil && a.Check(name, key) == nil {
			s.known[name] = true
			for _, n := range a.Replicas {
				s.known[n] = true
			}
		}
	}
	out := make([]string, 0, len(s.known))
	for n := range s.known {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// BadAnchor is an entry of the anchors that does not hold.
type BadAnchor struct {
	Replica string
	Err     error
}

func (b BadAnchor) Error() string {
	return fmt.Sprintf("the audit anchor of %s in the store: %v", b.Replica, b.Err)
}

// Anchors are every replica's latest anchor whose signature holds under
// the replicas' token (UseReplicaKey); the entries that do not (unsigned,
// forged, malformed) are returned apart, for the caller to refuse: a
// verification cannot rely on them.
func (s *Store) Anchors(ctx context.Context) (map[string]audit.Anchor, []BadAnchor, error) {
	key, err := s.replicaKey()
	if err != nil {
		return nil, nil, err
	}
	m, err := s.c.HGetAll(ctx, s.anchorsKey()).Result()
	if err != nil {
		return nil, nil, err
	}
	out := make(map[string]audit.Anchor, len(m))
	var bad []BadAnchor
	for replica, v := range m {
		var a audit.Anchor
		if err := json.Unmarshal([]byte(v), &a); err != nil {
			bad = append(bad, BadAnchor{replica, fmt.Errorf("malformed: %w", err)})
			continue
		}
		if err := a.Check(replica, key); err != nil {
			bad = append(bad, BadAnchor{replica, err})
			continue
		}
		out[replica] = a
	}
	slices.SortFunc(bad, func(x, y BadAnchor) int { return strings.Compare(x.Replica, y.Replica) })
	return out, bad, nil
}
