package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReceiveSnapshotRefused: a replica without a snapshot store takes no
// snapshot another hands over, and says why (the one handing it over then
// tries another replica, or keeps it). The whole path, a snapshot handed
// over and resumed, is cmd/pysandbox's TestReplicaHandoff.
func TestReceiveSnapshotRefused(t *testing.T) {
	r := &replica{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/snapshots/{id}", r.receiveSnapshot)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/internal/snapshots/s-00112233445566778899aabbccddeeff.replica-0.00112233", strings.NewReader("PYSBSNAP1\n")))
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "keeps no paused sessions") {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
	// Without a cluster, or a store, there is nothing to hand over.
	r.handOff()
	r.attach(nil, 1<<20, 0, nil)
	if r.sessions != nil {
		t.Error("attached without sessions")
	}
}
