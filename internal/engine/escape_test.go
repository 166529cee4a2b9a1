package engine

import (
	"context"
	"testing"
)

func TestExplore(t *testing.T) {
	e := newEngine(t, nil)
	r, err := e.Run(context.Background(), RunRequest{Code: `
import os, sys, socket
print(open('/proc/self/mountinfo').read())
print(sorted(os.listdir('/dev')))
print(sorted(os.listdir('/')))
print(sorted(os.environ.items()))
print(os.getpid(), os.getuid(), os.getgid(), os.getgroups())
print(open('/proc/self/uid_map').read(), open('/proc/self/gid_map').read())
print(socket.if_nameindex())
print(open('/proc/net/route').read())
print([ (d, open('/proc/%s/cmdline'%d,'rb').read()) for d in os.listdir('/proc') if d.isdigit()])
print({fd: os.readlink('/proc/self/fd/'+fd) for fd in os.listdir('/proc/self/fd')})
print(os.readlink('/proc/self/ns/pid'))
print([l for l in open('/proc/self/status') if l.startswith(('Cap','NoNew','Seccomp','Uid','Gid','Groups'))])
`})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\n%s\n%+v", r.Stdout, r.Stderr, r)
}
