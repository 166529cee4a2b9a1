package sharedstate

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/audit"
)

// Audit anchors: each replica writes the head of its audit chain here,
// now and then and when it stops, so that `pysandbox audit verify
// --store` can tell a chain cut short (or lost with its volume) from a
// whole one. An anchor only moves forward.

func (s *Store) anchorsKey() string { return s.prefix + "audit-anchors" }

// anchorScript sets a replica's anchor unless the one there is later.
var anchorScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and cjson.decode(cur).seq >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
`)

// SetAnchor records replica's chain head.
func (s *Store) SetAnchor(ctx context.Context, replica string, a audit.Anchor) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return anchorScript.Run(ctx, s.c, []string{s.anchorsKey()}, replica, a.Seq, data).Err()
}

// Anchors are every replica's latest anchor.
func (s *Store) Anchors(ctx context.Context) (map[string]audit.Anchor, error) {
	m, err := s.c.HGetAll(ctx, s.anchorsKey()).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]audit.Anchor, len(m))
	for replica, v := range m {
		var a audit.Anchor
		if err := json.Unmarshal([]byte(v), &a); err != nil {
			return nil, fmt.Errorf("the anchor of %s is malformed: %v", replica, err)
		}
		out[replica] = a
	}
	return out, nil
}
