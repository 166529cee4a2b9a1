package httpserver

import (
	"context"
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

// bodies bounds the request bodies being read at once.
type bodies struct {
	sem           *semaphore.Weighted
	max           int64
	wait, timeout time.Duration
}

func newBodies(maxRequest int64) *bodies {
	return &bodies{sem: semaphore.NewWeighted(max(bodyBudget, maxRequest)), max: maxRequest, wait: budgetWait, timeout: bodyTimeout}
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
		ctx, cancel := context.WithTimeout(r.Context(), b.wait)
		err := b.sem.Acquire(ctx, n)
		cancel()
		if err != nil {
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
		body := &budgetBody{ReadCloser: r.Body, release: func() { b.sem.Release(n); rc.SetReadDeadline(time.Time{}) }}
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
