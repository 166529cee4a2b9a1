package pool

import (
	"context"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/worker"
)

func TestRunPhases(t *testing.T) {
	e, p := newPooledEngine(t, 0, nil)
	spec := e.RunSpec()
	spec.Stdout, spec.Stderr = io.Discard, io.Discard
	for i := 0; i < 6; i++ {
		c, err := p.spawn(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		c.attach(io.Discard, io.Discard)
		t0 := time.Now()
		conn := worker.NewConn(c.Control())
		conn.Ready(context.Background())
		t1 := time.Now()
		conn.Run(context.Background(), worker.Request{Code: "print('hi')"})
		t2 := time.Now()
		fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
		unix.Poll(fds, 5000)
		tp := time.Now()
		c.copies.Wait()
		tc := time.Now()
		c.Wait()
		t3 := time.Now()
		t.Logf("pidfd %v copies %v", tp.Sub(t2), tc.Sub(t2))
		c.Close()
		t4 := time.Now()
		t.Logf("ready %v run %v wait %v close %v", t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3))
	}
}
