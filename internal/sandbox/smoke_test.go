package sandbox

import (
	"bytes"
	"context"
	"testing"
)

func TestSmoke(t *testing.T) {
	var out, errb bytes.Buffer
	sb, err := NewNative().Start(context.Background(), &Spec{
		Python: "/usr/bin/python3", Prefix: "/usr",
		Args:   []string{"-I", "-c", "import os,socket; print(os.getuid(), os.getcwd(), socket.gethostname(), sorted(os.listdir('/'))); print(open('/proc/self/status').read())"},
		Env:    []string{"PATH=/usr/bin"},
		Limits: Limits{MemoryBytes: 256 << 20, MaxProcs: 32, TmpBytes: 64 << 20},
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	e := sb.Wait()
	sb.Close()
	t.Logf("exit %+v\nstdout:%s\nstderr:%s", e, out.String(), errb.String())
}
