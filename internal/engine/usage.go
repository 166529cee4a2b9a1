package engine

import (
	"context"
	"time"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

// Usage is what a run in flight has used so far: CPU time of every process
// in its sandbox, and the memory they hold now. Both are 0 when the
// sandbox has no cgroup to measure them (an unprivileged server without
// delegation).
type Usage struct {
	CPU         time.Duration
	MemoryBytes int64
}

// UsageProbe reads a run's usage now; it is cheap (a few cgroup files)
// and safe to call from any goroutine until the run ends, after which it
// reports zeros or the last figures.
type UsageProbe func() Usage

type usageKey struct{}

// WithUsageObserver returns a context under which a run, once it has its
// sandbox, hands observe a probe of its usage. The operator console
// (through internal/tools and internal/activity) shows runs in flight
// with it.
func WithUsageObserver(ctx context.Context, observe func(UsageProbe)) context.Context {
	return context.WithValue(ctx, usageKey{}, observe)
}

// observeUsage hands ctx's observer, if any, a probe of sb. A session's
// sandbox has used CPU before this run: cpuBefore is subtracted.
func observeUsage(ctx context.Context, sb sandbox.Sandbox, cpuBefore time.Duration) {
	observe, _ := ctx.Value(usageKey{}).(func(UsageProbe))
	if observe == nil {
		return
	}
	cpu, _ := sb.(interface{ CPUUsage() time.Duration })
	mem, _ := sb.(interface{ MemoryCurrent() int64 })
	observe(func() Usage {
		var u Usage
		if cpu != nil {
			u.CPU = max(cpu.CPUUsage()-cpuBefore, 0)
		}
		if mem != nil {
			u.MemoryBytes = mem.MemoryCurrent()
		}
		return u
	})
}
