package sharedstate

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/audit"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

var replicaKey = []byte("0123456789abcdef0123456789abcdef-replicas")

func head(n int) string { return strings.Repeat(string(rune('a'+n%6)), 64) }

// anchorStore is one replica's connection, with the replicas' token.
func anchorStore(t *testing.T, url string) *Store {
	s := open(t, url)
	s.UseReplicaKey(replicaKey)
	return s
}

// TestAnchorsSigned: anchors are signed, move only forward, and name the
// replicas whose anchors their replica saw, even once those are deleted.
func TestAnchorsSigned(t *testing.T) {
	r := redisserver.Start(t)
	a, b := anchorStore(t, r.URL()), anchorStore(t, r.URL())
	ctx := context.Background()
	if err := a.SetAnchor(ctx, "r-a", audit.Anchor{Seq: 5, Head: head(5)}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetAnchor(ctx, "r-b", audit.Anchor{Seq: 3, Head: head(3)}); err != nil {
		t.Fatal(err)
	}
	// a again, with an older head (a chain that lost records): it stays
	// at 5, and now names r-b.
	if err := a.SetAnchor(ctx, "r-a", audit.Anchor{Seq: 2, Head: head(2)}); err != nil {
		t.Fatal(err)
	}
	got, bad, err := b.Anchors(ctx)
	if err != nil || len(bad) != 0 {
		t.Fatalf("%v %v", bad, err)
	}
	both := []string{"r-a", "r-b"}
	if ga := got["r-a"]; ga.Seq != 5 || ga.Head != head(5) || !slices.Equal(ga.Replicas, both) {
		t.Errorf("r-a: %+v, want seq 5 naming %v", ga, both)
	}
	if gb := got["r-b"]; gb.Seq != 3 || !slices.Equal(gb.Replicas, both) {
		t.Errorf("r-b: %+v", gb)
	}
	// r-b's anchor deleted: r-a's next anchor still names it.
	if err := a.c.HDel(ctx, a.anchorsKey(), "r-b").Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.SetAnchor(ctx, "r-a", audit.Anchor{Seq: 6, Head: head(6)}); err != nil {
		t.Fatal(err)
	}
	got, _, _ = b.Anchors(ctx)
	if ga := got["r-a"]; ga.Seq != 6 || !slices.Equal(ga.Replicas, both) {
		t.Errorf("after r-b's anchor was deleted: %+v", ga)
	}
	// Without the token, nothing is signed or checked.
	plain := open(t, r.URL())
	if err := plain.SetAnchor(ctx, "r-c", audit.Anchor{Seq: 1, Head: head(1)}); err == nil || !strings.Contains(err.Error(), "no replicas' token") {
		t.Errorf("set without the token: %v", err)
	}
	if _, _, err := plain.Anchors(ctx); err == nil {
		t.Error("anchors read without the token")
	}
}

// TestForgedAnchors: an anchor anyone else wrote (unsigned, signed with
// another token, a replica's copied under another name, malformed) is
// reported, not used; a replica replaces a forged anchor of its own.
func TestForgedAnchors(t *testing.T) {
	r := redisserver.Start(t)
	a := anchorStore(t, r.URL())
	ctx := context.Background()
	if err := a.SetAnchor(ctx, "r-a", audit.Anchor{Seq: 9, Head: head(9)}); err != nil {
		t.Fatal(err)
	}
	genuine, _ := a.c.HGet(ctx, a.anchorsKey(), "r-a").Result()
	other, _ := json.Marshal(audit.Anchor{Seq: 4, Head: head(4)}.Sign("r-d", []byte("the token of another deployment!!")))
	shorter, _ := json.Marshal(audit.Anchor{Seq: 4, Head: head(4)})
	a.c.HSet(ctx, a.anchorsKey(), "r-b", genuine, "r-c", "{", "r-d", other)
	// A shorter head, unsigned, in place of r-a's.
	a.c.HSet(ctx, a.anchorsKey(), "r-a", shorter)
	got, bad, err := a.Anchors(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("forged anchors were taken: %+v %v", got, err)
	}
	want := map[string]error{"r-a": audit.ErrUnsigned, "r-b": audit.ErrForged, "r-d": audit.ErrForged}
	if len(bad) != 4 {
		t.Fatalf("bad %v, want r-a..r-d", bad)
	}
	for _, b := range bad {
		if w, ok := want[b.Replica]; ok && !errors.Is(b.Err, w) || !ok && !strings.Contains(b.Error(), "the audit anchor of r-c in the store: malformed") {
			t.Errorf("%s: %v", b.Replica, b)
		}
	}
	// r-a writes its head again: the forged one goes, even though a
	// signed one of its would never move back.
	if err := a.SetAnchor(ctx, "r-a", audit.Anchor{Seq: 2, Head: head(2)}); err != nil {
		t.Fatal(err)
	}
	got, _, _ = a.Anchors(ctx)
	if ga := got["r-a"]; ga.Seq != 2 || ga.Head != head(2) {
		t.Errorf("r-a after replacing the forged anchor: %+v", ga)
	}
}
