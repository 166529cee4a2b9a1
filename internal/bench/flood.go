package bench

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// underFlood measures req while burners runs spin the CPU (a pure Python
// busy loop each, as long as the measurement lasts): with a CPU quota per
// run, the burners cannot starve the trivial runs or the server.
func underFlood(ctx context.Context, eng *engine.Engine, n, burners int, req engine.RunRequest, between func() error) ([]time.Duration, error) {
	floodCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	started := make(chan struct{}, burners)
	errc := make(chan error, burners)
	for range burners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started <- struct{}{}
			_, err := eng.Run(floodCtx, engine.RunRequest{Code: "while True:\n    pass", Timeout: eng.Config().MaxTimeout})
			if err != nil && floodCtx.Err() == nil {
				errc <- err
			}
		}()
	}
	for range burners {
		<-started
	}
	// Let the burners' sandboxes start and begin spinning.
	time.Sleep(time.Second)
	d, err := measureBetween(n, between, func() error { return runOK(ctx, eng, req) })
	stop()
	wg.Wait()
	close(errc)
	if err == nil {
		if ferr, ok := <-errc; ok {
			err = errors.Join(errors.New("a CPU-burning run failed"), ferr)
		}
	}
	return d, err
}
