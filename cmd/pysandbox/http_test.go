package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestServeHTTP(t *testing.T) {
	addr := freePort(t)
	startServe(t, addr, "http://"+addr, nil)
	var health map[string]string
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if health["status"] != "ok" || health["posture"] != "sandboxed" {
		t.Fatalf("healthz: %v", health)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_python", Arguments: map[string]any{"code": "import socket\nsocket.gethostname()"}})
	if err != nil {
		t.Fatal(err)
	}
	out := res.StructuredContent.(map[string]any)
	if res.IsError || out["return_value"] != "pysandbox" {
		t.Fatalf("%v", out)
	}

	// A request with a foreign Host header (DNS rebinding) is refused.
	req, _ := http.NewRequest("POST", "http://"+addr+"/mcp", strings.NewReader(`{}`))
	req.Host = "evil.example:80"
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Errorf("foreign Host header accepted: %s", resp.Status)
	}
}
