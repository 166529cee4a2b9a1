package httpserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// The SDK reads a request's whole body before it parses it (up to
// MaxRequestBytes, some 22 MiB for the largest upload). A caller that
// sends many large bodies slowly would make the server hold all of them
// at once. So the bodies being read are bounded in all (bodyBudget bytes,
// by their declared length; one without a length counts as the largest),
// and each must arrive within bodyTimeout.
const (
	bodyBudget   = 256 << 20
	bodyTimeout  = time.Minute
	budgetWait   = 30 * time.Second
	budgetRetrys = "5"
)

// bodies bounds the request bodies being read at once: in all, and per
// caller (a quarter of the budget, at least the largest body), so that
// one caller's slow bodies cannot make everyone else wait.
type bodies struct {
	sem           *semaphore.Weighted
	max, share    int64
	wait, timeout time.Duration

	mu   sync.Mutex
	held map[string]int64
}

func newBodies(maxRequest int64) *bodies {
	budget := max(bodyBudget, maxRequest)
	return &bodies{sem: semaphore.NewWeighted(budget), max: maxRequest, share: max(budget/4, maxRequest), wait: budgetWait, timeout: bodyTimeout, held: map[string]int64{}}
}

// take counts n bytes against who's share, or says it is used up.
func (b *bodies) take(who string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[who] > 0 && b.held[who]+n > b.share {
		return false
	}
	b.held[who] += n
	return true
}

func (b *bodies) give(who string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[who] -= n; b.held[who] <= 0 {
		delete(b.held, who)
	}
}

func (b *bodies) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		n := r.ContentLength
		if n < 0 || n > b.max {
			n = b.max
		}
		n = max(n, 1)
		who := callerOf(r)
		if !b.take(who, n) {
			w.Header().Set("Retry-After", budgetRetrys)
			refuseWith(w, http.StatusServiceUnavailable, fmt.Sprintf("your requests' bodies being read at once would pass the %.1f MiB one caller may have (a request that declares no length counts as the largest); finish sending the others, then retry", float64(b.share)/(1<<20)))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), b.wait)
		err := b.sem.Acquire(ctx, n)
		cancel()
		if err != nil {
			b.give(who, n)
			w.Header().Set("Retry-After", budgetRetrys)
			if r.Context().Err() == nil {
				refuseWith(w, http.StatusServiceUnavailable, "the server is reading as many request bodies as it holds at once; retry in a few seconds")
			}
			return
		}
		rc := http.NewResponseController(w)
		// The body must arrive in time; the deadline is lifted once it has,
		// so that the connection's later reads (which notice a client that
		// goes away during a long call) are not cut.
		rc.SetReadDeadline(time.Now().Add(b.timeout))
		body := &budgetBody{ReadCloser: r.Body, release: func() { b.sem.Release(n); b.give(who, n); rc.SetReadDeadline(time.Time{}) }}
		r.Body = body
		defer body.done()
		next.ServeHTTP(w, r)
	})
}

// budgetBody gives its place in the budget back once it has been read
// (or closed, or its request ends).
type budgetBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *budgetBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *budgetBody) Close() error {
	b.done()
	return b.ReadCloser.Close()
}

func (b *budgetBody) done() { b.once.Do(b.release) }
