package cluster_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/testutil/redisserver"
)

// TestSendSnapshot: a snapshot goes to the receiver's SnapshotPath with
// the replicas' token, whole; a refusal comes back as an error that says
// why.
func TestSendSnapshot(t *testing.T) {
	r := redisserver.Start(t)
	st := store(t, r)
	const token = "0123456789abcdef0123456789abcdef-replicas"
	got := make(chan string, 1)
	recv := httptest.NewServer(cluster.InternalAuth(token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, cluster.SnapshotPath) {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if strings.HasSuffix(r.URL.Path, "refused") {
			http.Error(w, "this replica is stopping", http.StatusServiceUnavailable)
			return
		}
		got <- r.Header.Get(cluster.SenderHeader) + " " + strings.TrimPrefix(r.URL.Path, cluster.SnapshotPath) + " " + string(body)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer recv.Close()
	a := join(t, st, "replica-a", "http://127.0.0.1:1")
	b := join(t, st, "replica-b", recv.URL)
	ctx := context.Background()
	for _, tok := range []string{token, "not the replicas' token"} {
		f := a.NewForwarder(tok)
		err := f.SendSnapshot(ctx, b.Self(), "s-0011.replica-a.00112233", strings.NewReader("the file"), 8)
		switch {
		case tok == token && err != nil:
			t.Errorf("with the token: %v", err)
		case tok == token:
			if g := <-got; g != "replica-a s-0011.replica-a.00112233 the file" {
				t.Errorf("received %q", g)
			}
		case err == nil || !strings.Contains(err.Error(), "401"):
			t.Errorf("without the token: %v", err)
		}
		f.Close()
	}
	f := a.NewForwarder(token)
	defer f.Close()
	if err := f.SendSnapshot(ctx, b.Self(), "refused", strings.NewReader("x"), 1); err == nil || !strings.Contains(err.Error(), "this replica is stopping") {
		t.Errorf("a refusal: %v", err)
	}
}
