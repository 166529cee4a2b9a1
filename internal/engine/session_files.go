package engine

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pysandbox/pysandbox/internal/pep"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

// Workspace lends the session's workspace to f; closing the session waits
// for f to return.
func (s *Sessions) Workspace(id string, f func(*workspace.Dir) error) error {
	sess, err := s.get(id)
	if err != nil {
		return err
	}
	sess.wsUsers.Add(1)
	defer sess.wsUsers.Done()
	sess.mu.Lock()
	dead := sess.dead
	sess.mu.Unlock()
	if dead == pausedWhy {
		return &PausedError{ID: id, owner: sess.Owner}
	}
	if dead != "" {
		return &SessionGoneError{ID: id, Why: dead}
	}
	sess.touch()
	return f(sess.ws)
}

// sessionPackages is where install_package puts packages, inside the
// session's workspace; the worker puts it on sys.path when it exists.
const sessionPackages = ".packages"

// Install makes packages importable in a session from its next run on. The
// whole requirement set (the session's and these) is resolved by the
// installer in its own sandbox, as one cached environment, which is then
// copied into the session's workspace (the cached environment itself stays
// read-only and shared). Modules the session already imported keep their
// old versions until it restarts.
func (s *Sessions) Install(ctx context.Context, id string, packages []string, progress func(string)) (*Installed, error) {
	sess, err := s.get(id)
	if err != nil {
		return nil, err
	}
	if err := sess.runMu.LockCtx(ctx); err != nil {
		return nil, err // cancelled while a run had the session: nothing done
	}
	defer sess.runMu.Unlock()
	reqs, errs := pep.MergeRequirements(sess.reqs, packages)
	if len(errs) > 0 {
		return nil, &RequestError{Msg: "invalid requirement: " + errs[0].Error()}
	}
	if err := s.e.checkRequested(reqs); err != nil {
		return nil, err
	}
	// Met by the interpreter as it is, with everything the session asked
	// for before (and nothing installed into the session to shadow it):
	// kept as the session's requirements, for what it installs later.
	if !sess.installed && sess.renv.env == nil {
		if have, ok := s.e.preinstalled(ctx, sess.renv.py, reqs); ok {
			tellPreinstalled(sess.renv.py, have, progress)
			sess.reqs = reqs
			return &Installed{Preinstalled: have}, nil
		}
	}
	if s.e.cfg.Deps == nil {
		return nil, &RequestError{Msg: "this server installs no packages (it was started without a dependency cache)"}
	}
	env, release, err := s.e.cfg.Deps.Ensure(ctx, sess.renv.py, reqs, progress)
	if err != nil {
		return nil, requestError(err)
	}
	defer release()
	if err := s.e.checkInstalled(env); err != nil {
		return nil, err
	}
	err = s.Workspace(id, func(d *workspace.Dir) error { return copyTree(env.Site, d, sessionPackages) })
	if err != nil {
		return nil, fmt.Errorf("engine: copy the packages into the session: %w", err)
	}
	sess.reqs = env.Requirements
	sess.installed = true
	return &Installed{Requirements: env.Requirements}, nil
}

// Installed is what install_package did: the session's requirements, as
// installed for it; or, when the server's Python met all of them as it
// is, nothing installed and those it met ("name version").
type Installed struct {
	Requirements []string
	Preinstalled []string
}

// copyTree copies the regular files under src into the workspace at dst.
func copyTree(src string, d *workspace.Dir, dst string) error {
	return filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return d.Write(dst+"/"+filepath.ToSlash(rel), data, int64(len(data))+1)
	})
}
