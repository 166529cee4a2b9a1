package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func fixed(l Limits) func(string) Limits { return func(string) Limits { return l } }

// One identity fills its runs and queue places and is refused; another
// identity is not affected; a waiter runs when a slot frees, in turn.
func TestRunQuota(t *testing.T) {
	q := New(fixed(Limits{Runs: 2, Queue: 1}))
	ctx := context.Background()
	r1, err1 := q.Run(ctx, "alice")
	r2, err2 := q.Run(ctx, "alice")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	got := make(chan func(), 1)
	go func() {
		r, err := q.Run(ctx, "alice") // waits in alice's one queue place
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	for {
		if _, w := q.InUse("alice"); w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err := q.Run(ctx, "alice")
	var qe *Error
	if !errors.As(err, &qe) || !errors.Is(err, ErrQuota) || qe.Identity != "alice" {
		t.Fatalf("a fourth run: %v", err)
	}
	rb, err := q.Run(ctx, "bob")
	if err != nil {
		t.Fatalf("bob is refused because of alice: %v", err)
	}
	rb()
	r1()
	select {
	case r3 := <-got:
		r3()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting run did not start when a slot freed")
	}
	r2()
	if run, wait := q.InUse("alice"); run != 0 || wait != 0 || len(q.state) != 0 {
		t.Errorf("left over: %d running, %d waiting, %d identities", run, wait, len(q.state))
	}
}

// A waiter whose context ends gives its queue place back.
func TestRunQuotaCancel(t *testing.T) {
	q := New(fixed(Limits{Runs: 1, Queue: 1}))
	release, _ := q.Run(context.Background(), "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := q.Run(ctx, "a"); done <- err }()
	for {
		if _, w := q.InUse("a"); w == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("%v", err)
	}
	if _, w := q.InUse("a"); w != 0 {
		t.Errorf("queue place kept after cancel")
	}
	release()
}

// Many identities at once, each within its own bound (run with -race).
func TestRunQuotaConcurrent(t *testing.T) {
	q := New(fixed(Limits{Runs: 2, Queue: 100}))
	var mu sync.Mutex
	peak := map[string]int{}
	now := map[string]int{}
	var wg sync.WaitGroup
	for i := range 60 {
		id := []string{"a", "b", "c"}[i%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := q.Run(context.Background(), id)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			now[id]++
			peak[id] = max(peak[id], now[id])
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			now[id]--
			mu.Unlock()
			release()
		}()
	}
	wg.Wait()
	for id, p := range peak {
		if p > 2 {
			t.Errorf("%s had %d runs at once, quota 2", id, p)
		}
	}
}

// No limits: nothing is counted or refused.
func TestNoQuota(t *testing.T) {
	var q *Quotas
	r, err := q.Run(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	r()
	q = New(fixed(Limits{}))
	for range 100 {
		if _, err := q.Run(context.Background(), "x"); err != nil {
			t.Fatal(err)
		}
	}
}
