// Package refservers runs the official MCP reference servers from npm
// (@modelcontextprotocol/server-everything, server-memory and
// server-filesystem) for tests of upstream tools: real servers that nobody
// here wrote. scripts/refservers.sh installs them, pinned, with a pinned
// Node, into a cache outside the work tree; the first test that needs them
// in a test binary runs it.
package refservers

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	once     sync.Once
	cacheDir string
	setupErr error
)

// dir installs the servers (once per process) and returns the cache.
func dir(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "refservers.sh")
		var stderr bytes.Buffer
		cmd := exec.Command("bash", script)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			setupErr = fmt.Errorf("%s: %v\n%s", script, err, stderr.String())
			return
		}
		cacheDir = strings.TrimSpace(string(out))
	})
	if setupErr != nil {
		t.Fatalf("installing the MCP reference servers: %v", setupErr)
	}
	return cacheDir
}

// Node is the pinned Node binary.
func Node(t testing.TB) string {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	return filepath.Join(dir(t), "node_modules", "node-linux-"+arch, "bin", "node")
}

func script(t testing.TB, server string) string {
	return filepath.Join(dir(t), "node_modules", "@modelcontextprotocol", "server-"+server, "dist", "index.js")
}

// Everything is the command and arguments of server-everything on stdio:
// tools that echo, add, return structured content, images and errors,
// and one that runs as long as asked (trigger-long-running-operation).
func Everything(t testing.TB) (string, []string) {
	return Node(t), []string{script(t, "everything"), "stdio"}
}

// Memory is server-memory (a knowledge graph) keeping its graph in file.
// It reads the file's name from its environment, so the command is env.
func Memory(t testing.TB, file string) (string, []string) {
	return "/usr/bin/env", []string{"MEMORY_FILE_PATH=" + file, Node(t), script(t, "memory")}
}

// Filesystem is server-filesystem confined to dirs.
func Filesystem(t testing.TB, dirs ...string) (string, []string) {
	return Node(t), append([]string{script(t, "filesystem")}, dirs...)
}

// EverythingHTTP starts server-everything on streamable HTTP on a free
// loopback port and returns its URL; it is stopped when the test ends.
func EverythingHTTP(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(Node(t), script(t, "everything"), "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		closed := false
		for sc.Scan() {
			if !closed && strings.Contains(sc.Text(), "listening on port") {
				close(listening)
				closed = true
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	select {
	case <-listening:
	case <-ctx.Done():
		t.Fatal("server-everything did not start listening on streamable HTTP within 60 s")
	}
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
}

// TypeScriptSDK is the directory of the official TypeScript MCP SDK's ES
// modules (the version the reference servers depend on), for tests that
// drive pysandbox with that SDK's client: import
// TypeScriptSDK(t)+"/client/index.js".
func TypeScriptSDK(t testing.TB) string {
	return filepath.Join(dir(t), "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm")
}
