package sharedstate

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/cluster"
)

// Directory lists the replicas that run (cluster.Directory): each under
// a key of its own that expires unless refreshed, plus a set of names to
// list them by.
func (s *Store) Directory() cluster.Directory { return directory{s} }

type directory struct{ s *Store }

func (d directory) key(name string) string { return d.s.prefix + "replica:" + name }
func (d directory) set() string            { return d.s.prefix + "replicas" }

func (d directory) Register(ctx context.Context, m cluster.Member, ttl time.Duration) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = d.s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, d.key(m.Name), data, ttl)
		p.SAdd(ctx, d.set(), m.Name)
		return nil
	})
	return err
}

// deregisterScript deletes a replica's entry only if it is still the
// incarnation leaving: a restarted replica of the same name keeps its own.
var deregisterScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v).incarnation == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[2])
end
return 0
`)

func (d directory) Deregister(ctx context.Context, m cluster.Member) error {
	return deregisterScript.Run(ctx, d.s.c, []string{d.key(m.Name), d.set()}, m.Incarnation, m.Name).Err()
}

func (d directory) Lookup(ctx context.Context, name string) (cluster.Member, bool, error) {
	data, err := d.s.c.Get(ctx, d.key(name)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return cluster.Member{}, false, nil
	case err != nil:
		return cluster.Member{}, false, err
	}
	var m cluster.Member
	if err := json.Unmarshal(data, &m); err != nil || m.Name != name {
		// Not an entry a replica wrote under its own name.
		return cluster.Member{}, false, nil
	}
	return m, true, nil
}

func (d directory) Members(ctx context.Context) ([]cluster.Member, error) {
	names, err := d.s.c.SMembers(ctx, d.set()).Result()
	if err != nil || len(names) == 0 {
		return nil, err
	}
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = d.key(n)
	}
	vals, err := d.s.c.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, err
	}
	var out []cluster.Member
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			// Expired: drop the name (a replica that comes back adds it again).
			d.s.c.SRem(ctx, d.set(), names[i])
			continue
		}
		var m cluster.Member
		if json.Unmarshal([]byte(str), &m) == nil && m.Name == names[i] {
			out = append(out, m)
		}
	}
	return out, nil
}

func (d directory) goneKey(tag string) string { return d.s.prefix + "gone:" + tag }

// Gone marks an incarnation as left for good, for a day: ids of it are
// lost from then on. mark is the marker's signature (cluster checks it:
// anyone who can write the store could otherwise have a live replica's
// sessions taken for lost).
func (d directory) Gone(ctx context.Context, tag, mark string) error {
	return d.s.c.Set(ctx, d.goneKey(tag), mark, 24*time.Hour).Err()
}

func (d directory) WasGone(ctx context.Context, tag string) (string, error) {
	mark, err := d.s.c.Get(ctx, d.goneKey(tag)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return mark, err
}

func (d directory) handoffKey(id string) string { return d.s.prefix + "handoff:" + id }

// HandOff records which replica holds a session handed over by a replica
// that stopped, until ttl from now. rec carries its signature (cluster
// checks it: anyone who can write the store could otherwise route a
// session's calls to another replica).
func (d directory) HandOff(ctx context.Context, rec cluster.Handoff, ttl time.Duration) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return d.s.c.Set(ctx, d.handoffKey(rec.Session), data, ttl).Err()
}

// HandedTo returns the record of session id. One that does not parse is
// returned as found, empty, for cluster to refuse and say so.
func (d directory) HandedTo(ctx context.Context, id string) (cluster.Handoff, bool, error) {
	data, err := d.s.c.Get(ctx, d.handoffKey(id)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return cluster.Handoff{}, false, nil
	case err != nil:
		return cluster.Handoff{}, false, err
	}
	var rec cluster.Handoff
	if json.Unmarshal(data, &rec) != nil {
		return cluster.Handoff{}, true, nil
	}
	return rec, true, nil
}
