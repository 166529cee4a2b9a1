package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pysandbox/pysandbox/internal/cluster"
	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/snapshot"
)

// Handing paused sessions over. A replica that stops (SIGTERM: a rolling
// update, a scale-down, a node drain) pauses its sessions into its state
// directory, then sends each snapshot to a live replica, which verifies
// and adopts it; a record in the shared store says where each went
// (cluster.RecordHandoff), and calls on it are routed there from then on.
// So a scale-down loses nothing, and a rolling update keeps every session
// available while pods restart. What could not be handed over in time
// stays on this replica's volume, recorded as held here: it is served
// again when this replica comes back with it. Without another replica
// (the last one stops), everything stays here.

const (
	// handoffAfterDrain is how long after --drain-timeout the handoff may
	// go on: the pod's terminationGracePeriodSeconds must leave it that,
	// plus the few seconds the endpoints take to stop.
	handoffAfterDrain = 5 * time.Second
	// handoffCopies bounds the snapshots being sent at once (disk and
	// network, while the rest of the drain waits).
	handoffCopies = 4
	// importSlack is what a snapshot file holds beyond --max-snapshot
	// (its description, at most 4 MiB, and its trailer).
	importSlack = 5 << 20
)

// attach gives the replica the sessions whose snapshots it hands over
// and adopts; without a snapshot store (--state-dir none) it does neither,
// and ids of stopped incarnations stay lost, as before.
func (r *replica) attach(sessions *engine.Sessions, maxSnapshot int64, pausedTTL time.Duration, log *slog.Logger) {
	if r.cl == nil || sessions == nil || !sessions.CanPause() {
		return
	}
	r.sessions, r.maxSnapshot, r.log = sessions, maxSnapshot, log
	// A record must outlive the paused session it routes, and the session
	// resumed from it for a while: twice the paused TTL.
	r.recordTTL = 2 * pausedTTL
	r.cl.SetSnapshots(true)
}

// receiveSnapshot serves POST cluster.SnapshotPath{id}: a snapshot a
// replica that stops hands over. It is verified whole (its HMAC, under the
// key every replica derives from their token) before it is kept, then
// listed as a paused session of this replica.
func (r *replica) receiveSnapshot(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	switch {
	case r.sessions == nil:
		http.Error(w, "this replica keeps no paused sessions (--state-dir none, or its state directory is in use)", http.StatusConflict)
		return
	case r.draining.Load():
		// It would have to hand the session on in turn.
		http.Error(w, "this replica is stopping", http.StatusServiceUnavailable)
		return
	case !snapshot.ValidID(id):
		http.Error(w, "not a session id", http.StatusBadRequest)
		return
	}
	limit := r.maxSnapshot + importSlack
	if req.ContentLength > limit {
		http.Error(w, fmt.Sprintf("the snapshot is larger than this replica takes (%d MiB)", limit>>20), http.StatusRequestEntityTooLarge)
		return
	}
	info, err := r.sessions.SnapshotStore().Import(id, http.MaxBytesReader(w, req.Body, limit), limit)
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, snapshot.ErrTampered) {
			code = http.StatusUnprocessableEntity
		}
		r.log.Warn("handoff: a snapshot handed over was refused", "session", id, "err", err)
		http.Error(w, err.Error(), code)
		return
	}
	r.sessions.Adopt(info)
	from := req.Header.Get(cluster.SenderHeader)
	if len(from) > 63 {
		from = from[:63]
	}
	r.log.Info("handoff: adopted a paused session", "session", id, "from", from, "paused_by", info.Replica, "bytes", info.Size)
	w.WriteHeader(http.StatusNoContent)
}

// handOff sends this replica's paused sessions to the other replicas,
// after the drain paused them, until handoffAfterDrain past the drain's
// time. Once it handed any over, this replica leaves the directory, so
// that the others route the sessions by their records from then on.
func (r *replica) handOff() {
	if r.cl == nil || r.sessions == nil {
		return
	}
	ids := r.sessions.PausedIDs()
	if len(ids) == 0 {
		return
	}
	start := time.Now()
	begun := r.drainStart
	if begun.IsZero() {
		begun = start
	}
	deadline := begun.Add(r.drainFor + handoffAfterDrain)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var peers []cluster.Member
	members, err := r.cl.Members(ctx)
	for _, m := range members {
		if m.Name != r.cl.Self().Name {
			peers = append(peers, m)
		}
	}
	if len(peers) == 0 {
		r.log.Info("handoff: no other replica runs; the paused sessions stay in this replica's state directory", "sessions", len(ids), "err", err)
		return
	}
	// The most recently paused first: the likeliest to be called soon.
	st := r.sessions.SnapshotStore()
	infos := make([]snapshot.Info, 0, len(ids))
	for _, id := range ids {
		if in, err := st.Stat(id); err == nil {
			infos = append(infos, in)
		}
	}
	slices.SortFunc(infos, func(a, b snapshot.Info) int { return b.PausedAt.Compare(a.PausedAt) })

	var (
		mu     sync.Mutex
		handed []string
		kept   []string
		wg     sync.WaitGroup
		next   atomic.Int64
	)
	sem := make(chan struct{}, handoffCopies)
	for _, in := range infos {
		acquired := false
		select {
		case sem <- struct{}{}:
			acquired = true
		case <-ctx.Done():
		}
		// A copy begun in its last second would only be cut off.
		if time.Until(deadline) < time.Second {
			if acquired {
				<-sem
			}
			mu.Lock()
			kept = append(kept, in.ID)
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// Round robin, each copy starting at the next peer.
			first := int(next.Add(1) - 1)
			to, err := r.handOne(ctx, in, peers, first)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.log.Warn("handoff: a paused session stays in this replica's state directory", "session", in.ID, "err", err)
				kept = append(kept, in.ID)
				return
			}
			r.cl.HandedOver(in.ID, to)
			handed = append(handed, in.ID)
		}()
	}
	wg.Wait()
	// What stays here is recorded as held here: the others then say
	// "retry" for it until this replica is back, rather than "lost". (Its
	// deadline passed: a short time of its own.)
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	for _, id := range kept {
		if rctx.Err() != nil {
			break
		}
		if err := r.cl.RecordHandoff(rctx, id, r.cl.Self().Name, r.recordTTL); err != nil {
			r.log.Warn("handoff: could not record a session kept here", "session", id, "err", err)
		}
	}
	r.log.Info("handoff: paused sessions handed to other replicas", "handed", len(handed), "kept", len(kept), "took", time.Since(start).Round(time.Millisecond))
	if len(handed) == 0 {
		return
	}
	r.cl.Leave()
	for _, id := range handed {
		r.sessions.HandedOff(id)
	}
}

// handOne sends one snapshot to a peer, trying them in turn from first,
// and returns the name of the one that took it, once the store records
// it. The copy comes first: a replica killed during it, or a store that
// does not answer, leaves the session here, where the calls on it still
// go (at worst the peer keeps an unrouted copy until the paused TTL).
func (r *replica) handOne(ctx context.Context, in snapshot.Info, peers []cluster.Member, first int) (string, error) {
	var errs []error
	for i := range peers {
		if ctx.Err() != nil {
			errs = append(errs, errors.New("the drain's time ran out"))
			break
		}
		m := peers[(first+i)%len(peers)]
		if err := r.sendOne(ctx, m, in.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		// A moment of its own: the copy may have ended just in time.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := r.cl.RecordHandoff(rctx, in.ID, m.Name, r.recordTTL)
		cancel()
		if err != nil {
			return "", fmt.Errorf("%s took it, but %w", m.Name, err)
		}
		return m.Name, nil
	}
	return "", errors.Join(errs...)
}

func (r *replica) sendOne(ctx context.Context, m cluster.Member, id string) error {
	f, size, err := r.sessions.SnapshotStore().Export(id)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.fwd.SendSnapshot(ctx, m, id, f, size)
}
