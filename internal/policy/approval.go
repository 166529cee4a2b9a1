package policy

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A Sealer binds a human's approval to one exact request. The first pass
// of an approved call returns a RequestState sealed with AES-GCM under a
// key that never leaves this process; it names the tool, the caller, a
// digest of the arguments, an expiry and a nonce. The retry carrying the
// user's answer is honoured only if its state opens, matches the retried
// request and has not been used before. A client cannot forge one, reuse
// one for other code, or replay one.
type Sealer struct {
	aead cipher.AEAD
	ttl  time.Duration
	now  func() time.Time

	mu   sync.Mutex
	used map[string]time.Time // nonce -> expiry, without a NonceStore
	// nonces, when set, records used nonces where every replica sees
	// them (a shared store).
	nonces NonceStore
}

// NonceStore records approval nonces used, so that an approval is used
// once however many replicas could be handed its state.
type NonceStore interface {
	// UseOnce records nonce as used until until, and reports whether it
	// was unused. An error means it could not be checked.
	UseOnce(ctx context.Context, nonce string, until time.Time) (bool, error)
}

// Errors from Open. They all mean "ask again".
var (
	ErrStateInvalid   = errors.New("the approval state is not one this server issued")
	ErrStateExpired   = errors.New("the approval has expired")
	ErrStateMismatch  = errors.New("the approval was given for a different request")
	ErrStateUsed      = errors.New("the approval was already used")
	ErrStateUnchecked = errors.New("the approval could not be checked against the shared store")
)

// NewSealer returns a Sealer with a fresh random key; approvals expire
// after ttl. now is the clock (nil: time.Now).
func NewSealer(ttl time.Duration, now func() time.Time) (*Sealer, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("policy: approval key: %w", err)
	}
	return NewSharedSealer(key, ttl, now, nil)
}

// NewSharedSealer returns a Sealer with the given AES key (16, 24 or 32
// bytes) and, when nonces is set, used nonces kept there: replicas that
// share both honour each other's approvals, each once.
func NewSharedSealer(key []byte, ttl time.Duration, now func() time.Time, nonces NonceStore) (*Sealer, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("policy: approval key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("policy: approval key: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	return &Sealer{aead: aead, ttl: ttl, now: now, used: map[string]time.Time{}, nonces: nonces}, nil
}

type grant struct {
	Tool     string `json:"t"`
	Identity string `json:"i"`
	Args     string `json:"a"` // hex SHA-256 of the canonical arguments
	Expires  int64  `json:"e"` // unix nanoseconds
	Nonce    string `json:"n"`
}

// Seal returns the RequestState for a call of tool by identity with args.
func (s *Sealer) Seal(tool, identity string, args []byte) (string, error) {
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	g := grant{Tool: tool, Identity: identity, Args: ArgsDigest(args), Expires: s.now().Add(s.ttl).UnixNano(), Nonce: hex.EncodeToString(nonce)}
	plain, err := json.Marshal(g)
	if err != nil {
		return "", err
	}
	iv := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(iv); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(iv, iv, plain, nil)), nil
}

// Open checks a RequestState against the retried call and uses it up.
func (s *Sealer) Open(state, tool, identity string, args []byte) error {
	raw, err := base64.RawURLEncoding.DecodeString(state)
	if err != nil || len(raw) < s.aead.NonceSize()+s.aead.Overhead() || len(state) > 4096 {
		return ErrStateInvalid
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, raw[:n], raw[n:], nil)
	if err != nil {
		return ErrStateInvalid
	}
	var g grant
	if err := json.Unmarshal(plain, &g); err != nil {
		return ErrStateInvalid
	}
	now := s.now()
	if now.UnixNano() > g.Expires {
		return ErrStateExpired
	}
	if g.Tool != tool || g.Identity != identity || g.Args != ArgsDigest(args) {
		return ErrStateMismatch
	}
	// Used nonces are remembered here too: a shared store that lost its
	// data (a Redis restarted without persistence) must not make this
	// replica honour an approval twice.
	s.mu.Lock()
	for k, exp := range s.used {
		if now.UnixNano() > exp.UnixNano() {
			delete(s.used, k)
		}
	}
	if _, dup := s.used[g.Nonce]; dup {
		s.mu.Unlock()
		return ErrStateUsed
	}
	s.used[g.Nonce] = time.Unix(0, g.Expires)
	s.mu.Unlock()
	if s.nonces != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fresh, err := s.nonces.UseOnce(ctx, g.Nonce, time.Unix(0, g.Expires))
		switch {
		case err != nil:
			// Not used after all: the user is asked again, and a retry
			// with this state may still be honoured once the store answers.
			s.mu.Lock()
			delete(s.used, g.Nonce)
			s.mu.Unlock()
			return fmt.Errorf("%w: %v", ErrStateUnchecked, err)
		case !fresh:
			return ErrStateUsed
		}
	}
	return nil
}

// ArgsDigest is the hex SHA-256 of the arguments in a canonical form (keys
// sorted, no spacing, numbers as written), so a client that re-encodes the
// same arguments on its retry still matches, and any change does not.
func ArgsDigest(args []byte) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	canon := args
	if err := dec.Decode(&v); err == nil {
		if b, err := json.Marshal(v); err == nil {
			canon = b
		}
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}
