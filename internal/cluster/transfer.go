package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// SnapshotPath is where a replica takes the snapshot of a paused session
// another replica hands over as it stops: POST SnapshotPath + the
// session's id, the snapshot file as the body, with the replicas' token
// (InternalAuth). The receiver verifies the file's HMAC before it keeps
// it.
const SnapshotPath = "/internal/snapshots/"

// SenderHeader names the replica handing a snapshot over, for the
// receiver's log (the snapshot's own description names the replica that
// paused it, which may be another: a session handed on twice).
const SenderHeader = "X-Pysandbox-Replica"

// SendSnapshot hands session id's snapshot, size bytes read from body, to
// m. It returns once m has verified and adopted it; any other answer is
// an error, and the snapshot stays here.
func (f *Forwarder) SendSnapshot(ctx context.Context, m Member, id string, body io.Reader, size int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.Internal+SnapshotPath+url.PathEscape(id), body)
	if err != nil {
		return fmt.Errorf("cluster: hand session %s to %s: %w", id, m.Name, err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(SenderHeader, f.c.self.Name)
	resp, err := f.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cluster: hand session %s to %s: %w", id, m.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("cluster: hand session %s to %s: %s: %s", id, m.Name, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
