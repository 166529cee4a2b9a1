// Package sharedstate keeps what the replicas of one pysandbox deployment
// must agree on in Redis, a store clusters already run: rate-limit counts
// (so a global limit of N allows exactly N across replicas) and used
// approval nonces (so an approval answered through one replica is
// honoured by any, once). Without a store, a server keeps both in its own
// process, as before.
//
// Counting happens in Lua scripts, atomically on the Redis server, with
// the Redis server's clock: replicas whose clocks disagree still count in
// the same windows.
package sharedstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/policy"
)

// Store is a connection to the shared Redis.
type Store struct {
	c *redis.Client
	// prefix namespaces the keys of one deployment, so that several can
	// share a Redis. The {braces} keep every key of a deployment in one
	// hash slot, as the scripts (which name keys they build) need on a
	// Redis Cluster.
	prefix string

	mu sync.Mutex
	// key is the replicas' token (UseReplicaKey): it signs the audit
	// anchors.
	key []byte
	// known are the replicas this process saw anchor a chain (SetAnchor).
	known map[string]bool
}

// Options configure Open.
type Options struct {
	// Namespace separates deployments sharing one Redis; default
	// "pysandbox".
	Namespace string
	// Timeout bounds each operation; default 2 s. A call whose rate
	// limits cannot be counted in time is refused.
	Timeout time.Duration
}

// Open connects to the Redis at url (redis://[user:password@]host:port/db,
// rediss:// for TLS, or unix:///path) and checks that it answers.
func Open(ctx context.Context, url string, o Options) (*Store, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("sharedstate: %s: %w", redactURL(url), err)
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Namespace == "" {
		o.Namespace = "pysandbox"
	}
	if strings.ContainsAny(o.Namespace, "{}") {
		return nil, fmt.Errorf("sharedstate: namespace %q may not contain braces", o.Namespace)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = o.Timeout, o.Timeout, o.Timeout
	// A replica that cannot reach the store refuses calls quickly rather
	// than queueing them behind retries.
	opt.MaxRetries = 1
	s := &Store{c: redis.NewClient(opt), prefix: "{" + o.Namespace + "}:"}
	pctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := s.c.Ping(pctx).Err(); err != nil {
		s.c.Close()
		return nil, fmt.Errorf("sharedstate: %s does not answer: %w", redactURL(url), err)
	}
	return s, nil
}

// redisLog sends the client library's own messages (a dial that failed,
// retried) to the log at debug level: what matters reaches the caller as
// an error, with what to do.
type redisLog struct{}

func (redisLog) Printf(_ context.Context, format string, v ...any) {
	slog.Debug("redis client", "msg", fmt.Sprintf(format, v...))
}

func init() { redis.SetLogger(redisLog{}) }

// Close closes the connection.
func (s *Store) Close() error { return s.c.Close() }

// Ping checks that the store answers (readiness).
func (s *Store) Ping(ctx context.Context) error { return s.c.Ping(ctx).Err() }

// redactURL drops a password from a URL for messages.
func redactURL(url string) string {
	if i := strings.Index(url, "@"); i >= 0 {
		if j := strings.Index(url, "://"); j >= 0 && j < i {
			return url[:j+3] + "***" + url[i:]
		}
	}
	return url
}

// Limiter counts rate limits in the store (policy.RateLimiter).
func (s *Store) Limiter() policy.RateLimiter { return &limiter{s} }

type limiter struct{ s *Store }

// reserveScript counts one call against every limit, or against none when
// one is exhausted. KEYS are the limits' counters (without their window);
// ARGV holds each one's period and maximum in milliseconds and calls. It
// returns {0, now, start...} when counted, {i, reset, now} when limit i
// (1-based) is exhausted. A counter named twice in one call is counted
// once, as Limiter does.
var reserveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local starts = {}
for i = 1, #KEYS do
  local period = tonumber(ARGV[2*i-1])
  local start = now - (now % period)
  starts[i] = start
  local n = tonumber(redis.call('GET', KEYS[i] .. ':' .. start) or '0')
  if n >= tonumber(ARGV[2*i]) then
    return {i, start + period, now}
  end
end
local seen = {}
local out = {0, now}
for i = 1, #KEYS do
  local k = KEYS[i] .. ':' .. starts[i]
  if not seen[k] then
    seen[k] = true
    redis.call('INCR', k)
    redis.call('PEXPIREAT', k, starts[i] + tonumber(ARGV[2*i-1]) + 60000)
  end
  out[#out+1] = starts[i]
end
return out
`)

// cancelScript gives back one count of each key (full keys, with their
// window), never below zero.
var cancelScript = redis.NewScript(`
for i = 1, #KEYS do
  if tonumber(redis.call('GET', KEYS[i]) or '0') > 0 then
    redis.call('DECR', KEYS[i])
  end
end
return 0
`)

func (l *limiter) key(lim policy.Limit, identity string) string {
	id := ""
	if lim.Scope != policy.ScopeGlobal {
		id = identity
	}
	// Hashed: counters and identities are the policy's and the callers'
	// words, and may hold anything.
	sum := sha256.Sum256([]byte(lim.Counter + "\x00" + string(lim.Scope) + "\x00" + lim.Period.String() + "\x00" + id))
	return l.s.prefix + "rl:" + hex.EncodeToString(sum[:16])
}

func (l *limiter) Reserve(ctx context.Context, limits []policy.Limit, identity string) (policy.Reservation, *policy.Exceeded, error) {
	if len(limits) == 0 {
		return noReservation{}, nil, nil
	}
	keys := make([]string, len(limits))
	args := make([]any, 0, 2*len(limits))
	for i, lim := range limits {
		keys[i] = l.key(lim, identity)
		args = append(args, lim.Period.Milliseconds(), lim.Max)
	}
	res, err := reserveScript.Run(ctx, l.s.c, keys, args...).Int64Slice()
	if err != nil {
		return nil, nil, fmt.Errorf("the shared rate-limit store did not answer (%v)", err)
	}
	if len(res) < 2 {
		return nil, nil, errors.New("the shared rate-limit store gave a malformed answer")
	}
	if i := res[0]; i > 0 {
		if int(i) > len(limits) || len(res) != 3 {
			return nil, nil, errors.New("the shared rate-limit store gave a malformed answer")
		}
		return nil, policy.NewExceeded(limits[i-1], time.UnixMilli(res[1]), time.UnixMilli(res[2])), nil
	}
	if len(res) != 2+len(limits) {
		return nil, nil, errors.New("the shared rate-limit store gave a malformed answer")
	}
	r := &reservation{s: l.s}
	seen := map[string]bool{}
	for i, k := range keys {
		full := fmt.Sprintf("%s:%d", k, res[2+i])
		if !seen[full] {
			seen[full] = true
			r.keys = append(r.keys, full)
		}
	}
	return r, nil, nil
}

// Counts reads lim's count in its current window, on the store's clock
// (policy.CountReader).
func (l *limiter) Counts(ctx context.Context, lim policy.Limit, identities []string) ([]int64, time.Time, error) {
	if lim.Scope == policy.ScopeGlobal {
		identities = []string{""}
	}
	now, err := l.s.c.Time(ctx).Result()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("the shared rate-limit store did not answer (%v)", err)
	}
	period := lim.Period.Milliseconds()
	start := now.UnixMilli() - now.UnixMilli()%period
	keys := make([]string, len(identities))
	for i, id := range identities {
		keys[i] = fmt.Sprintf("%s:%d", l.key(lim, id), start)
	}
	out := make([]int64, len(identities))
	if len(keys) == 0 {
		return out, time.UnixMilli(start + period), nil
	}
	vals, err := l.s.c.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("the shared rate-limit store did not answer (%v)", err)
	}
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i], _ = strconv.ParseInt(s, 10, 64)
		}
	}
	return out, time.UnixMilli(start + period), nil
}

type noReservation struct{}

func (noReservation) Cancel() {}

type reservation struct {
	s    *Store
	keys []string
}

// Cancel gives the counts back (best effort: a store that does not answer
// keeps them, which errs on the side of the limit).
func (r *reservation) Cancel() {
	if r == nil || len(r.keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cancelScript.Run(ctx, r.s.c, r.keys)
	r.keys = nil
}

// Nonces records used approval nonces in the store (policy.NonceStore).
func (s *Store) Nonces() policy.NonceStore { return nonces{s} }

type nonces struct{ s *Store }

func (n nonces) UseOnce(ctx context.Context, nonce string, until time.Time) (bool, error) {
	if nonce == "" || len(nonce) > 128 {
		return false, errors.New("malformed nonce")
	}
	// Kept a minute past the approval's expiry, after which Open refuses
	// it as expired anyway.
	ok, err := n.s.c.SetArgs(ctx, n.s.prefix+"nonce:"+nonce, 1, redis.SetArgs{Mode: "NX", ExpireAt: until.Add(time.Minute)}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("the shared store did not answer (%v)", err)
	}
	return ok == "OK", nil
}
