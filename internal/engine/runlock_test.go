package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRunLock(t *testing.T) {
	var l runLock
	if !l.TryLock() || l.TryLock() {
		t.Fatal("TryLock")
	}
	// A waiter whose context ends leaves without the lock.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- l.LockCtx(ctx) }()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("LockCtx after cancel: %v", err)
	}
	// An ended context never takes it, even when it is free.
	l.Unlock()
	if err := l.LockCtx(ctx); err == nil {
		t.Fatal("a cancelled context took the lock")
	}
	// A waiter gets it when it is released.
	l.Lock()
	go func() { got <- l.LockCtx(context.Background()) }()
	select {
	case <-got:
		t.Fatal("took a held lock")
	case <-time.After(10 * time.Millisecond):
	}
	l.Unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	l.Unlock()
	defer func() {
		if recover() == nil {
			t.Error("Unlock of an unlocked lock did not panic")
		}
	}()
	l.Unlock()
}
