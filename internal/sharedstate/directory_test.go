package sharedstate

import (
	"context"
	"testing"
	"time"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// TestDirectory: entries are stored under their own name and listed;
// one under another name is not; gone marks and handoff records read back
// as written (the cluster checks them), records until their time to live.
func TestDirectory(t *testing.T) {
	r := redisserver.Start(t)
	d := open(t, r.URL()).Directory()
	ctx := context.Background()
	m := cluster.Member{Name: "r-a", Incarnation: "0011aabb", MCP: "http://127.0.0.1:1", Internal: "http://127.0.0.1:2", Sig: "s"}
	if err := d.Register(ctx, m, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := d.Lookup(ctx, "r-a"); !ok || err != nil || got != m {
		t.Errorf("lookup: %+v %v %v", got, ok, err)
	}
	if _, ok, _ := d.Lookup(ctx, "r-b"); ok {
		t.Error("a name never registered was found")
	}
	if all, err := d.Members(ctx); err != nil || len(all) != 1 || all[0] != m {
		t.Errorf("members: %+v %v", all, err)
	}
	if mark, err := d.WasGone(ctx, m.Tag()); mark != "" || err != nil {
		t.Errorf("gone before it left: %q %v", mark, err)
	}
	if err := d.Gone(ctx, m.Tag(), "mark-of-r-a"); err != nil {
		t.Fatal(err)
	}
	if mark, err := d.WasGone(ctx, m.Tag()); mark != "mark-of-r-a" || err != nil {
		t.Errorf("gone: %q %v", mark, err)
	}
	if _, found, err := d.HandedTo(ctx, "s-01.r-a.0011aabb"); found || err != nil {
		t.Errorf("a record never written: %v %v", found, err)
	}
	rec := cluster.Handoff{Session: "s-01.r-a.0011aabb", Holder: "r-b", Expires: 1, Sig: "sig"}
	if err := d.HandOff(ctx, rec, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, found, err := d.HandedTo(ctx, rec.Session); !found || err != nil || got != rec {
		t.Errorf("handoff record: %+v %v %v", got, found, err)
	}
	// A later one replaces it.
	rec.Holder = "r-c"
	if err := d.HandOff(ctx, rec, time.Second); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := d.HandedTo(ctx, rec.Session); got.Holder != "r-c" {
		t.Errorf("the later record: %+v", got)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, found, _ := d.HandedTo(ctx, rec.Session); found {
		t.Error("a record outlived its time to live")
	}
	if err := d.Deregister(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := d.Lookup(ctx, "r-a"); ok {
		t.Error("found after it left")
	}
}
