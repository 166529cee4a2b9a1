package tools

import (
	"context"
	"fmt"
	"testing"
)

func TestInbound(t *testing.T) {
	b := newInbound()
	ctx, done := b.start(context.Background(), "c-1", "alice")
	// Another caller cannot cancel alice's call.
	if b.cancel("c-1", "bob") || ctx.Err() != nil {
		t.Fatal("bob cancelled alice's call")
	}
	if !b.cancel("c-1", "alice") || ctx.Err() == nil {
		t.Fatal("alice's cancel did not end her call")
	}
	done()
	if len(b.live) != 0 {
		t.Errorf("live after done: %v", b.live)
	}
	// A cancel that comes before its call ends the call as it starts.
	if b.cancel("c-2", "alice") {
		t.Error("a call not yet here reported as in flight")
	}
	ctx, done = b.start(context.Background(), "c-2", "alice")
	if ctx.Err() == nil {
		t.Error("a call cancelled before it came runs")
	}
	done()
	if len(b.early) != 0 {
		t.Errorf("early after its call came: %v", b.early)
	}
	// Early cancels are bounded.
	for i := range maxEarlyCancels + 100 {
		b.cancel(fmt.Sprint("x-", i), "alice")
	}
	if len(b.early) != maxEarlyCancels {
		t.Errorf("%d early cancels kept, bound %d", len(b.early), maxEarlyCancels)
	}
	// A call without an id is not registered.
	_, done = b.start(context.Background(), "", "alice")
	done()
	if len(b.live) != 0 {
		t.Errorf("live: %v", b.live)
	}
}
