package pool

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pysandbox/pysandbox/internal/engine"
)

// TestTrace runs pooled children with tracing on and checks that each
// record tells its story in order, on one clock with the server's.
func TestTrace(t *testing.T) {
	traces := make(chan *Trace, 16)
	p := newTracedPool(t, traces)
	e := engineWith(t, p)
	for range 2 {
		r, err := e.Run(context.Background(), engine.RunRequest{Code: "print('hi')"})
		if err != nil || r.Status != engine.StatusSuccess {
			t.Fatalf("%v %+v", err, r)
		}
	}
	var tr *Trace
	select {
	case tr = <-traces:
	case <-time.After(time.Minute):
		t.Fatal("no trace")
	}
	var names []string
	last := int64(0)
	for _, s := range tr.Stamps {
		names = append(names, s.Name)
		if s.Wall < last {
			t.Errorf("stamp %s goes back in time", s.Name)
		}
		last = s.Wall
	}
	for _, want := range []string{"zygote.request", "zygote.fork", "b.start", "b.joined", "b.mounts", "b.user", "b.seccomp", "b.user_paths"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s stamp in %v", want, names)
		}
	}
	order := []string{"spawn", "sent", "spawned", "hello", "joined", "ready", "taken", "exited", "ended", "closing", "closed"}
	for i, name := range order {
		v, ok := tr.Server[name]
		if !ok {
			t.Errorf("no server stamp %s in %v", name, tr.Server)
			continue
		}
		if i > 0 && v < tr.Server[order[i-1]] && name != "closing" {
			t.Errorf("server stamp %s before %s", name, order[i-1])
		}
	}
	if first := tr.Stamps[0].Wall; first < tr.Server["sent"] || first > tr.Server["ready"] {
		t.Errorf("the child's clock does not line up with the server's: %d not within [%d, %d]", first, tr.Server["sent"], tr.Server["ready"])
	}
	if tr.B.CPU <= 0 || tr.B.Minflt <= 0 {
		t.Errorf("no usage for the run's pid 1: %+v", tr.B)
	}
}

func newTracedPool(t *testing.T, traces chan *Trace) *Pool {
	t.Helper()
	native := nativeOf(t)
	cold := engineOver(t, native)
	p, err := New(context.Background(), Config{Backend: native, Spec: cold.RunSpec(), Size: 1, MaxConcurrent: 4, MemoryBudget: 1 << 30,
		Trace: func(tr *Trace) {
			select {
			case traces <- tr:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestReadTraceHostile feeds readTrace what a hostile child could send:
// it must bound what it keeps and never consume past the line.
func TestReadTraceHostile(t *testing.T) {
	for _, c := range []struct {
		name, line string
		ok         bool
		stamps     int
	}{
		{"good", `{"op":"trace","stamps":[["b.start",1,2,3]]}`, true, 1},
		{"wrong op", `{"op":"ready","stamps":[]}`, false, 0},
		{"not json", `trace!`, false, 0},
		{"odd stamps", `{"op":"trace","stamps":[["x"],[1,2,3,4],["` + strings.Repeat("n", 100) + `",1,2,3],["ok",-5,1e300,"z"]]}`, true, 1},
		{"too many", `{"op":"trace","stamps":[` + strings.TrimSuffix(strings.Repeat(`["s",1,1,1],`, 500), ",") + `]}`, true, maxStamps},
		{"no newline", strings.Repeat("x", maxTraceLength+10), false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			a, b := fileConn(t, fds[0]), fileConn(t, fds[1])
			defer a.Close()
			defer b.Close()
			go func() {
				b.Write([]byte(c.line + "\n" + `{"op":"ready"}` + "\n"))
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stamps, err := readTrace(ctx, a)
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok=%v", err, c.ok)
			}
			if len(stamps) != c.stamps {
				t.Errorf("%d stamps, want %d", len(stamps), c.stamps)
			}
			for _, s := range stamps {
				if s.Wall < 0 || s.CPU < 0 || len(s.Name) > maxStampName {
					t.Errorf("unbounded stamp %+v", s)
				}
			}
			if c.ok {
				// The ready message behind the line is still there.
				buf := make([]byte, 64)
				n, _ := a.Read(buf)
				if !strings.HasPrefix(string(buf[:n]), `{"op":"ready"}`) {
					t.Errorf("readTrace consumed past its line: %q left", buf[:n])
				}
			}
		})
	}
}

func fileConn(t *testing.T, fd int) *net.UnixConn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "conn")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}
