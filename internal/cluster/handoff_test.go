package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// TestOwnerHandoff: with snapshots, a session outlives its incarnation:
// it goes where the handoff record says (this replica included), to an
// earlier incarnation's replica, or to the id's replica under another
// incarnation; a holder that does not run is to be retried; an
// incarnation that left with no record is lost, as before.
func TestOwnerHandoff(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	c := join(t, st, "replica-c", "http://127.0.0.1:3")
	for _, x := range []*cluster.Cluster{a, b, c} {
		x.SetSnapshots(true)
	}
	ctx := context.Background()
	sid := "s-0011" + c.SessionSuffix()
	kept := "s-0022" + c.SessionSuffix()
	// c hands sid to a as it stops, and keeps kept on its volume.
	if err := c.RecordHandoff(ctx, sid, "replica-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.RecordHandoff(ctx, kept, "replica-c", time.Hour); err != nil {
		t.Fatal(err)
	}
	c.HandedOver(sid, "replica-a")
	// c, still running, sends its handed session on; the others still
	// ask c, which runs.
	if m, local, err := c.Owner(ctx, sid, false); local || err != nil || m.Name != "replica-a" {
		t.Errorf("a handed session at the replica that handed it: %+v %v %v", m, local, err)
	}
	if _, local, err := c.Owner(ctx, kept, false); !local || err != nil {
		t.Errorf("a kept session at its replica: %v %v", local, err)
	}
	if m, _, err := b.Owner(ctx, sid, false); err != nil || m.Name != "replica-c" {
		t.Errorf("while its replica runs: %+v %v", m, err)
	}
	c.Leave()
	if m, local, err := b.Owner(ctx, sid, false); local || err != nil || m.Name != "replica-a" {
		t.Errorf("after its replica left, from another: %+v %v %v", m, local, err)
	}
	if _, local, err := a.Owner(ctx, sid, false); !local || err != nil {
		t.Errorf("after its replica left, at the holder: %v %v", local, err)
	}
	// Kept on a volume whose replica does not run: retry, not lost.
	if _, _, err := b.Owner(ctx, kept, false); !errors.Is(err, cluster.ErrUnreachable) {
		t.Errorf("kept by a replica that left: %v", err)
	}
	// Its MCP sessions are not snapshotted: lost.
	if _, _, err := b.Owner(ctx, c.Self().Tag()+".XYZ", true); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("an MCP session of a replica that left: %v", err)
	}
	// No record, the incarnation left: lost, as without snapshots.
	if _, _, err := b.Owner(ctx, "s-0033"+c.SessionSuffix(), false); !errors.Is(err, cluster.ErrLost) {
		t.Errorf("a session of a replica that left, not handed over: %v", err)
	}
	// An earlier incarnation of this replica: local (its volume may hold
	// the session).
	if _, local, err := b.Owner(ctx, "s-0044.replica-b.deadbeef", false); !local || err != nil {
		t.Errorf("an earlier incarnation of this replica: %v %v", local, err)
	}
	// An earlier incarnation of a replica that runs: there.
	if m, local, err := b.Owner(ctx, "s-0055.replica-a.deadbeef", false); local || err != nil || m.Name != "replica-a" {
		t.Errorf("an earlier incarnation of another replica: %+v %v %v", m, local, err)
	}
	// A record naming a replica that does not run: retry.
	if err := a.RecordHandoff(ctx, "s-0066.replica-z.deadbeef", "replica-z", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Owner(ctx, "s-0066.replica-z.deadbeef", false); !errors.Is(err, cluster.ErrUnreachable) {
		t.Errorf("held by a replica that does not run: %v", err)
	}
	// A record wins over the id's name.
	if err := a.RecordHandoff(ctx, "s-0077.replica-a.deadbeef", "replica-b", time.Hour); err != nil {
		t.Fatal(err)
	}
	if m, _, err := a.Owner(ctx, "s-0077.replica-a.deadbeef", false); err != nil || m.Name != "replica-b" {
		t.Errorf("an earlier incarnation's session handed to another: %+v %v", m, err)
	}
	if _, local, err := b.Owner(ctx, "s-0077.replica-a.deadbeef", false); !local || err != nil {
		t.Errorf("at its holder: %v %v", local, err)
	}
}

// TestOwnerWithoutSnapshots: without SetSnapshots, records are not read:
// sessions of incarnations that no longer run are lost, as before.
func TestOwnerWithoutSnapshots(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	b := join(t, st, "replica-b", "http://127.0.0.1:2")
	ctx := context.Background()
	id := "s-0011.replica-c.deadbeef"
	if err := a.RecordHandoff(ctx, id, "replica-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s-0022.replica-b.deadbeef", "s-0033.replica-a.deadbeef"} {
		if _, _, err := b.Owner(ctx, id, false); !errors.Is(err, cluster.ErrLost) {
			t.Errorf("%s: %v", id, err)
		}
	}
	// Never listed: retry at first, as before, whatever the record says.
	if _, _, err := b.Owner(ctx, id, false); !errors.Is(err, cluster.ErrUnreachable) {
		t.Errorf("%s: %v", id, err)
	}
}

// TestForgedHandoffRecord: a record anyone who can write the store put
// there (unsigned, made up, signed with another token, a genuine one of
// another session copied, expired) routes nothing, and is logged; the
// session of a replica that left is then lost, as with no record.
func TestForgedHandoffRecord(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	var logs syncBuffer
	b, err := cluster.Join(context.Background(), st.Directory(), "replica-b", "http://127.0.0.1:2", "http://127.0.0.1:2", key, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Leave)
	c := join(t, st, "replica-c", "http://127.0.0.1:3")
	b.SetSnapshots(true)
	ctx := context.Background()
	sid := "s-0011" + c.SessionSuffix()
	c.Leave()
	raw := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer raw.Close()
	// A genuine record, of another session, to copy.
	if err := a.RecordHandoff(ctx, "s-0099"+c.SessionSuffix(), "replica-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	genuine, err := raw.Get(ctx, "{pysandbox}:handoff:s-0099"+c.SessionSuffix()).Result()
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour).UnixMilli()
	for name, rec := range map[string]string{
		"not json":                  "replica-a",
		"unsigned":                  mustJSON(cluster.Handoff{Session: sid, Holder: "replica-a", Expires: far}),
		"made up":                   mustJSON(cluster.Handoff{Session: sid, Holder: "replica-a", Expires: far, Sig: strings.Repeat("0", 64)}),
		"another token":             signedRecord(t, []byte("the token of another deployment!!"), sid, "replica-a", far),
		"expired":                   signedRecord(t, key, sid, "replica-a", time.Now().Add(-time.Minute).UnixMilli()),
		"another session's, copied": genuine,
	} {
		if err := raw.Set(ctx, "{pysandbox}:handoff:"+sid, rec, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if m, local, err := b.Owner(ctx, sid, false); local || !errors.Is(err, cluster.ErrLost) {
			t.Errorf("%s record: answered %+v %v %v", name, m, local, err)
		}
	}
	if !strings.Contains(logs.String(), "a handoff record not signed with the replicas' token, or expired, is ignored") || !strings.Contains(logs.String(), sid) {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
	// Logged once however many there are.
	if n := strings.Count(logs.String(), "handoff record"); n != 1 {
		t.Errorf("%d warnings logged", n)
	}
	// The genuine record: routed.
	if err := a.RecordHandoff(ctx, sid, "replica-a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if m, _, err := b.Owner(ctx, sid, false); err != nil || m.Name != "replica-a" {
		t.Errorf("the genuine record: %+v %v", m, err)
	}
}

func mustJSON(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(data)
}

// signedRecord is a record signed as a replica with key would (through a
// cluster of its own on a store of its own).
func signedRecord(t *testing.T, k []byte, sid, holder string, expires int64) string {
	t.Helper()
	return mustJSON(cluster.SignHandoff(k, cluster.Handoff{Session: sid, Holder: holder, Expires: expires}))
}
