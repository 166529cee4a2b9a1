package engine

import (
	"context"
	"sync"
)

// runLock is a session's one-run-at-a-time lock, whose wait a call's
// context can end: a call cancelled while it waits behind another run
// must leave without running. With a plain mutex it ran once its turn
// came, after its caller had gone, and the interrupt sent on its
// cancellation came before the run did, so the grace period then killed
// the session. The zero value is unlocked.
type runLock struct {
	once sync.Once
	ch   chan struct{}
}

func (l *runLock) c() chan struct{} {
	l.once.Do(func() { l.ch = make(chan struct{}, 1) })
	return l.ch
}

// Lock waits for the lock.
func (l *runLock) Lock() { l.c() <- struct{}{} }

// LockCtx waits for the lock until ctx ends; it returns ctx's error then,
// without the lock.
func (l *runLock) LockCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l.c() <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes the lock if it is free.
func (l *runLock) TryLock() bool {
	select {
	case l.c() <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock releases the lock, which must be held.
func (l *runLock) Unlock() {
	select {
	case <-l.c():
	default:
		panic("engine: unlock of an unlocked runLock")
	}
}
