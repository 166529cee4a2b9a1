package httpserver

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// TestBodyBudget: the bodies being read are bounded in all, a body that
// does not arrive in time is cut, and its place comes back.
func TestBodyBudget(t *testing.T) {
	b := &bodies{sem: semaphore.NewWeighted(10), max: 8, share: 100, wait: 300 * time.Millisecond, timeout: time.Second, held: map[string]int64{}}
	readErr := make(chan error, 4)
	hs := httptest.NewServer(b.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		if err == nil {
			io.WriteString(w, "read")
		}
	})))
	t.Cleanup(hs.Close)
	host := strings.TrimPrefix(hs.URL, "http://")
	// A body of 8 bytes that sends 4 and stalls holds 8 of the 10.
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: 8\r\n\r\nabcd", host)
	post := func(body string) (int, string) {
		resp, err := http.Post(hs.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	// Wait until the stalled one holds its place (a hang guard only).
	deadline := time.Now().Add(time.Minute)
	for b.sem.TryAcquire(10) {
		b.sem.Release(10)
		if time.Now().After(deadline) {
			t.Fatal("the stalled body never took its place")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := post("12345678"); code != http.StatusServiceUnavailable || !strings.Contains(body, "retry in a few seconds") {
		t.Errorf("past the budget: %d %s", code, body)
	}
	// Small bodies still fit beside it.
	if code, body := post("1"); code != http.StatusOK || body != "read" {
		t.Errorf("a small body: %d %s", code, body)
	}
	<-readErr // the small one's
	// The stalled body is cut at its deadline, and its place comes back.
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("the stalled body was read whole")
		}
	case <-time.After(time.Minute):
		t.Fatal("the stalled body was never cut")
	}
	if code, body := post("12345678"); code != http.StatusOK {
		t.Errorf("after the cut: %d %s", code, body)
	}
}

// TestBodyShare: one caller's bodies being read are bounded to its share,
// so it cannot make the others wait for the whole budget.
func TestBodyShare(t *testing.T) {
	b := &bodies{sem: semaphore.NewWeighted(100), max: 8, share: 10, wait: time.Second, timeout: time.Minute, held: map[string]int64{}}
	hs := httptest.NewServer(b.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
	})))
	t.Cleanup(hs.Close)
	host := strings.TrimPrefix(hs.URL, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: 8\r\n\r\nabcd", host)
	deadline := time.Now().Add(time.Minute)
	for {
		b.mu.Lock()
		held := b.held[anonymousCaller]
		b.mu.Unlock()
		if held == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled body never took its place")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(hs.URL, "application/json", strings.NewReader("12345678"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "one caller may have") {
		t.Errorf("past the caller's share: %d %s", resp.StatusCode, body)
	}
}
