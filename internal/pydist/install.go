package pydist

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pysandbox/pysandbox/internal/deps"
)

// Install installs a version (any mode but never), returning it and
// whether it was downloaded now.
func (m *Manager) Install(ctx context.Context, version string, who Who, check func(string) error, progress func(string)) (*Installed, bool, error) {
	if m.cfg.Mode == Never {
		return nil, false, &NotAvailableError{Msg: "python downloads are off (--python-downloads never)"}
	}
	d, err := m.pick(ctx, version, nil, who, check)
	if err != nil {
		return nil, false, err
	}
	if check != nil {
		if err := check(d.Version()); err != nil {
			return nil, false, err
		}
	}
	had := false
	for _, in := range m.Installed() {
		if in.Key == artifactKey(d) {
			had = true
		}
	}
	key, err := m.install(ctx, d, who, progress)
	if err != nil {
		return nil, false, err
	}
	for _, in := range m.Installed() {
		if in.Key == key {
			return &in, !had, nil
		}
	}
	return nil, false, &InstallError{Version: d.Version(), Err: errors.New("it was removed from the cache as soon as it was installed")}
}

func (m *Manager) event(e Event) {
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(e)
	}
}

// artifactKey is a download's name in the cache: its metadata key and
// the start of its digest, so a rebuilt archive of the same version is
// another entry.
func artifactKey(d *Download) string {
	return strings.ToLower(d.Key) + "-" + d.SHA256[:16]
}

type failure struct {
	err error
	at  time.Time
}

// install makes sure the cache holds d, downloading, verifying, unpacking
// and checking it when it does not; concurrent calls share one install.
func (m *Manager) install(ctx context.Context, d *Download, who Who, progress func(string)) (string, error) {
	key := artifactKey(d)
	u := Mirrored(d.URL, m.cfg.Mirror)
	m.mu.Lock()
	f, ok := m.failed[key]
	m.mu.Unlock()
	if ok && time.Since(f.at) < failTTL {
		return "", &InstallError{Version: d.Version(), Err: fmt.Errorf("%w (%s ago; it is tried again %s after)", f.err, time.Since(f.at).Round(time.Second), failTTL)}
	}
	_, release, err := m.cfg.Cache.EnsureArtifact(ctx, key, deps.Artifact{
		Kind: deps.KindPython, Python: d.Version(), Source: redact(u), SHA256: d.SHA256, Timeout: m.cfg.Timeout,
		Fill: func(ctx context.Context, dir string, charge func(int64) error, progress func(string)) error {
			return m.fill(ctx, d, u, who, dir, charge, progress)
		},
	}, progress)
	if err != nil {
		var ie *InstallError
		var ae *ArchiveError
		var de *DownloadError
		var ce *checksumError
		var dep *deps.InstallError
		if (errors.As(err, &ae) || errors.As(err, &de) || errors.As(err, &ce)) && ctx.Err() == nil {
			m.mu.Lock()
			m.failed[key] = failure{err: err, at: time.Now()}
			m.mu.Unlock()
		}
		switch {
		case errors.As(err, &ie):
			return "", ie
		case errors.As(err, &ae), errors.As(err, &de):
			return "", &InstallError{Version: d.Version(), Err: err}
		case errors.As(err, &dep):
			return "", &InstallError{Version: d.Version(), Err: errors.New(strings.Join(dep.Lines, "; "))}
		case ctx.Err() != nil:
			return "", ctx.Err()
		}
		return "", &InstallError{Version: d.Version(), Err: err}
	}
	release()
	return key, nil
}

// fill downloads d into the build directory next to dir, checks its
// digest, unpacks it into dir and checks the result runs.
func (m *Manager) fill(ctx context.Context, d *Download, u string, who Who, dir string, charge func(int64) error, progress func(string)) (err error) {
	note := func(s string) {
		if progress != nil {
			progress("Python " + d.Version() + ": " + s)
		}
	}
	start := time.Now()
	charge = (&budget{charge: charge}).take
	ev := Event{Action: "install", Version: d.Version(), URL: redact(u), SHA256: d.SHA256, Who: who}
	defer func() {
		ev.Duration = time.Since(start)
		switch {
		case err == nil:
			ev.Outcome = "installed"
		case errors.As(err, new(*ArchiveError)), errors.As(err, new(*checksumError)):
			ev.Outcome, ev.Error = "refused", err.Error()
		default:
			ev.Outcome, ev.Error = "failed", err.Error()
		}
		// The event is the one report: serve logs and audits it, and
		// `pysandbox python install` says it once, as its own result.
		m.event(ev)
	}()
	archive := filepath.Join(filepath.Dir(dir), "archive.tar.gz")
	f, err := os.OpenFile(archive, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return diskError("save the download", err)
	}
	defer func() {
		f.Close()
		os.Remove(archive)
	}()
	if err := charge(deps.EntryCharge(0)); err != nil {
		return err
	}
	note("downloading " + redact(u))
	n, sum, err := m.fetch(ctx, u, who, f, charge, note)
	ev.Bytes = n
	if err != nil {
		return err
	}
	if sum != d.SHA256 {
		// Refused and deleted (by the deferred remove) before anything of
		// it is read.
		return &checksumError{url: redact(u), want: d.SHA256, got: sum}
	}
	note(fmt.Sprintf("downloaded %.1f MiB, SHA-256 verified; unpacking", float64(n)/(1<<20)))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("pydist: %w", err)
	}
	if err := unpack(ctx, bufio.NewReaderSize(f, 256<<10), dir, m.cfg.MaxTreeBytes, charge); err != nil {
		return err
	}
	f.Close()
	os.Remove(archive)
	// The archive's room, given back now that it is gone.
	if err := charge(-deps.EntryCharge(n)); err != nil {
		return err
	}
	if err := finish(dir); err != nil {
		return err
	}
	note("checking that it runs")
	if err := m.probe(ctx, dir, d); err != nil {
		return err
	}
	return nil
}

// checksumError is an archive whose digest is not the metadata's.
type checksumError struct{ url, want, got string }

func (e *checksumError) Error() string {
	return fmt.Sprintf("the archive from %s has SHA-256 %s, not the %s its download metadata names; it was deleted unread", e.url, e.got, e.want)
}

// budget takes room from the cache in chunks: each charge the cache
// makes takes its lock and reads its entries, which an archive of
// thousands of files should not pay for each file. What is taken and not
// used is given back when the tree is measured.
type budget struct {
	charge  func(int64) error
	prepaid int64
}

// chargeChunk is the least a budget takes from the cache at once.
const chargeChunk = 4 << 20

func (b *budget) take(n int64) error {
	if n <= b.prepaid {
		b.prepaid -= n
		return nil
	}
	need := n - b.prepaid
	chunk := max(need, chargeChunk)
	if err := b.charge(chunk); err != nil {
		// The cache may still hold what is needed, without the margin.
		if chunk == need {
			return err
		}
		if err := b.charge(need); err != nil {
			return err
		}
		chunk = need
	}
	b.prepaid += chunk - n
	return nil
}
