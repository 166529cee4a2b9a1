package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// syncBuffer is a log destination the heartbeat goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestForgedGoneMarker: a gone marker anyone who can write the store put
// there for a live replica (unsigned, made up, or a genuine one of
// another incarnation copied) does not make its sessions lost through
// the others, and is logged; the marker the replica writes when it
// leaves does.
func TestForgedGoneMarker(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	var logs syncBuffer
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	b, err := cluster.Join(context.Background(), st.Directory(), "replica-b", "http://127.0.0.1:2", "http://127.0.0.1:2", key, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Leave)
	raw := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer raw.Close()
	ctx := context.Background()
	tag := a.Self().Tag()
	sid := "s-0011" + a.SessionSuffix()
	for name, mark := range map[string]string{
		"unsigned":            "1",
		"made up":             strings.Repeat("0", 64),
		"another incarnation": cluster.GoneMark(key, "replica-a.00000000"),
		"another token":       cluster.GoneMark([]byte("the token of another deployment!!"), tag),
	} {
		if err := raw.Set(ctx, "{pysandbox}:gone:"+tag, mark, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, id := range []struct {
			id  string
			mcp bool
		}{{sid, false}, {a.NewMCPSessionID(), true}} {
			m, local, err := b.Owner(ctx, id.id, id.mcp)
			// Found, or (with its entry not refreshed in time on a
			// loaded machine) to be retried: never lost.
			if local || errors.Is(err, cluster.ErrLost) || err == nil && m.Name != "replica-a" || err != nil && !errors.Is(err, cluster.ErrUnreachable) {
				t.Errorf("%s marker: %s answered %+v %v %v", name, id.id, m, local, err)
			}
		}
	}
	if !strings.Contains(logs.String(), "a gone marker not signed with the replicas' token is ignored") || !strings.Contains(logs.String(), tag) {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
	// The replica's own marker, written as it leaves: lost at once.
	a.Leave()
	if _, _, err := b.Owner(ctx, sid, false); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("after it left: %v", err)
	}
	if mark, _ := raw.Get(ctx, "{pysandbox}:gone:"+tag).Result(); mark != cluster.GoneMark(key, tag) {
		t.Errorf("the marker it left is %q", mark)
	}
}
