package profiles

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// runner runs Python code through one profile's own tool names, the way
// that peer's clients call them, and returns the text they read.
type runner struct {
	spec string
	run  func(t *testing.T, code string) string
}

func runners(t *testing.T) []runner {
	so := serverOpts{timeout: 5 * time.Second}
	mk := func(spec string, f func(t *testing.T, cs *clientSession, code string) string) runner {
		var cs *clientSession
		return runner{spec, func(t *testing.T, code string) string {
			if cs == nil {
				cs = &clientSession{connect(t, spec, so), ""}
			}
			return f(t, cs, code)
		}}
	}
	return []runner{
		mk("mcp-run-python", func(t *testing.T, cs *clientSession, code string) string {
			text, _ := callText(t, cs.cs, "run_python_code", map[string]any{"python_code": code})
			return text
		}),
		mk("mcp-python-exec-sandbox", func(t *testing.T, cs *clientSession, code string) string {
			text, _ := callText(t, cs.cs, "execute_python", map[string]any{"script": code, "timeout_seconds": 5})
			return text
		}),
		mk("mcp-run-python-code", func(t *testing.T, cs *clientSession, code string) string {
			text, _ := callText(t, cs.cs, "run_python_code", map[string]any{"code": code})
			return text
		}),
		mk("mcp-sandbox", func(t *testing.T, cs *clientSession, code string) string {
			if cs.sandbox == "" {
				created, _ := callText(t, cs.cs, "create_sandbox", nil)
				cs.sandbox = between(created, `"sandbox_id": "`, `"`)
			}
			text, _ := callText(t, cs.cs, "execute_python_code", map[string]any{"sandbox_id": cs.sandbox, "code": code})
			if strings.Contains(text, "has ended") {
				// A bomb took the sandbox down with it: the next attack
				// gets a new one.
				created, _ := callText(t, cs.cs, "create_sandbox", nil)
				cs.sandbox = between(created, `"sandbox_id": "`, `"`)
				text, _ = callText(t, cs.cs, "execute_python_code", map[string]any{"sandbox_id": cs.sandbox, "code": code})
			}
			return text
		}),
	}
}

type clientSession struct {
	cs      *mcp.ClientSession
	sandbox string
}

// TestEscapeThroughProfiles: the escape suite's core attacks, sent through
// each profile's own tool names, find the same walls as through
// run_python: the host's files, the network, the host's processes, fork
// and memory bombs, and time.
func TestEscapeThroughProfiles(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret.txt")
	os.WriteFile(secret, []byte("HOST-SECRET-7f3a"), 0o644)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HOST-NETWORK-REACHED\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	attacks := []struct {
		name, code string
		leak       string // in the text only if the attack worked
	}{
		{"host file", fmt.Sprintf("try:\n    print(open(%q).read())\nexcept Exception as e:\n    print('refused', type(e).__name__)", secret), "HOST-SECRET-7f3a"},
		{"host shadow", "try:\n    print('SHADOW', open('/etc/shadow').read()[:4])\nexcept Exception as e:\n    print('refused', type(e).__name__)", "SHADOW"},
		{"network", fmt.Sprintf("import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', %d), timeout=2)\n    print(s.recv(100).decode())\nexcept Exception as e:\n    print('refused', type(e).__name__)", port), "HOST-NETWORK-REACHED"},
		{"processes", "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint('HOST-PROCS' if len(pids) > 20 else 'few', len(pids))", "HOST-PROCS"},
		{"fork bomb", "import os, time\nn = 0\ntry:\n    for i in range(2000):\n        if os.fork() == 0:\n            time.sleep(3)\n            os._exit(0)\n        n += 1\n    print('FORKED-ALL', n)\nexcept OSError as e:\n    print('stopped at', n)", "FORKED-ALL"},
		{"memory bomb", "b = bytearray(3 << 30)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('ALLOCATED-3GIB')", "ALLOCATED-3GIB"},
		{"endless loop", "import time\nt = time.time()\nwhile True:\n    if time.time() - t > 30:\n        print('RAN-30S')\n        break", "RAN-30S"},
	}
	for _, r := range runners(t) {
		t.Run(r.spec, func(t *testing.T) {
			for _, a := range attacks {
				start := time.Now()
				text := r.run(t, a.code)
				if strings.Contains(text, a.leak) {
					t.Errorf("%s: the attack worked through %s:\n%.2000s", a.name, r.spec, text)
				}
				t.Logf("%s: %s, %.120q", a.name, time.Since(start).Round(time.Millisecond), text)
			}
		})
	}
}
