package cli

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/pysandbox/pysandbox/internal/sharedstate"
	"github.com/pysandbox/pysandbox/internal/tools"
)

// storeFlags are serve's flags for state shared by the replicas of one
// deployment.
type storeFlags struct {
	url, namespace, keyFile string
}

func (f *storeFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "store", "", "shared state for several replicas behind one address: a Redis URL (redis://[user:password@]host:6379/0, rediss:// for TLS); rate limits and used approvals are then counted there, exactly as on one server. The environment variable PYSANDBOX_STORE_URL gives it too (keeps a password out of ps). Default: this process only")
	fs.StringVar(&f.namespace, "store-namespace", "pysandbox", "with --store: the name of this deployment's keys, so several can share a Redis")
	fs.StringVar(&f.keyFile, "approval-key-file", "", "the key that seals approval state (32 random bytes, raw, hex or base64; the file must not be readable by others), shared by every replica so that an approval answered through one is honoured by any; default: a random key of this process")
}

// storeURL is the shared store's URL: --store, else $PYSANDBOX_STORE_URL;
// "" for none.
func (f *storeFlags) storeURL() string {
	if f.url != "" {
		return f.url
	}
	return os.Getenv("PYSANDBOX_STORE_URL")
}

// shared is what the store flags give: the store (nil without --store)
// and the approval key (nil without --approval-key-file).
type shared struct {
	store *sharedstate.Store
	key   []byte
}

// open connects the shared store and reads the approval key.
func (f *storeFlags) open(ctx context.Context, log *slog.Logger) (*shared, error) {
	url := f.storeURL()
	sh := &shared{}
	if f.keyFile != "" {
		key, err := readApprovalKey(f.keyFile)
		if err != nil {
			return nil, err
		}
		sh.key = key
	}
	if url == "" {
		return sh, nil
	}
	st, err := sharedstate.Open(ctx, url, sharedstate.Options{Namespace: f.namespace})
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	sh.store = st
	if sh.key == nil {
		log.Warn("--store without --approval-key-file: each replica seals approvals with its own key, so an approval answered through one replica is asked again on another")
	}
	log.Info("shared state in Redis", "namespace", f.namespace)
	return sh, nil
}

// apply gives gov the shared parts.
func (sh *shared) apply(gov *tools.Governance) {
	gov.ApprovalKey = sh.key
	if sh.store != nil {
		gov.Limiter, gov.Nonces = sh.store.Limiter(), sh.store.Nonces()
	}
}

func (sh *shared) close() {
	if sh.store != nil {
		sh.store.Close()
	}
}

// readApprovalKey reads a 32-byte key given raw, in hex or in base64, from
// a file others cannot read.
func readApprovalKey(path string) ([]byte, error) {
	text, err := readSecretFile(path, "--approval-key-file")
	if err != nil {
		return nil, err
	}
	if raw, err := os.ReadFile(path); err == nil && len(raw) == 32 {
		return raw, nil
	}
	if k, err := hex.DecodeString(text); err == nil && len(k) == 32 {
		return k, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(text); err == nil && len(k) == 32 {
			return k, nil
		}
	}
	return nil, errors.New("--approval-key-file: want 32 bytes, raw, as 64 hex digits or in base64 (e.g. openssl rand -hex 32)")
}
