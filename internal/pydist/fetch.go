package pydist

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pysandbox/pysandbox/internal/egress"
)

// Every download goes through the server's egress proxy, the same one
// sandboxes use (internal/egress): the server opens a listener only it
// can reach (a unix socket in a directory of its own), serves it with a
// grant that may reach the download host and nothing else, and points an
// HTTP client at it as its proxy. So the connection is decided, limited
// and recorded (in the audit log) like every other, and a mirror that
// redirects to another host is refused by the proxy, not followed.

// Network serves a listener with the egress proxy: trusted are the
// host:port targets it may reach, who says whom the records belong to.
type Network func(l net.Listener, trusted []string, who Who) (stop func())

// Who says whom a download's connections are recorded for.
type Who struct {
	Identity string
	Tool     string // "run_python", "pysandbox python install", ...
}

// githubAssets are where github.com sends release downloads: the shipped
// URLs redirect there, so they are trusted with it.
var githubAssets = []string{"objects.githubusercontent.com:443", "release-assets.githubusercontent.com:443"}

// targets are the host:port a download of u may connect to.
func targets(u *url.URL) []string {
	t := egress.Target(u)
	out := []string{t}
	if t == "github.com:443" {
		out = append(out, githubAssets...)
	}
	return out
}

// DownloadError is a download that failed for a reason outside the
// request: the host could not be reached, answered with an error, or sent
// something else than the metadata promised.
type DownloadError struct {
	URL string
	Msg string
}

func (e *DownloadError) Error() string { return e.Msg }

// fetch downloads u into dst through the proxy, hashing as it goes, and
// returns the bytes written and their SHA-256. charge is called before
// each chunk is written; progress gets a line now and then.
func (m *Manager) fetch(ctx context.Context, u string, who Who, dst io.Writer, charge func(int64) error, progress func(string)) (int64, string, error) {
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return 0, "", &DownloadError{URL: u, Msg: fmt.Sprintf("%q is not an http(s) URL", u)}
	}
	if m.cfg.Network == nil {
		return 0, "", &DownloadError{URL: u, Msg: "this server has no network proxy to download through"}
	}
	dir, err := os.MkdirTemp("", "pysandbox-fetch-")
	if err != nil {
		return 0, "", fmt.Errorf("pydist: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "proxy")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return 0, "", fmt.Errorf("pydist: proxy listener: %w", err)
	}
	trusted := targets(pu)
	stop := m.cfg.Network(l, trusted, who)
	defer stop()
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "pysandbox-egress"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		TLSHandshakeTimeout:    30 * time.Second,
		ResponseHeaderTimeout:  m.cfg.HeaderTimeout,
		DisableCompression:     true, // the digest is of the bytes as served
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("too many redirects")
			}
			if t := targets(req.URL); !slices.Contains(trusted, t[0]) || (req.URL.Scheme != "https" && pu.Scheme == "https") {
				return fmt.Errorf("redirected to %s, which is not the download host", req.URL.Redacted())
			}
			return nil
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", &DownloadError{URL: u, Msg: err.Error()}
	}
	req.Header.Set("User-Agent", "pysandbox")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
		msg := reason(err)
		if strings.Contains(msg, "timeout awaiting response headers") {
			msg = fmt.Sprintf("no answer within %s", m.cfg.HeaderTimeout)
		}
		return 0, "", &DownloadError{URL: u, Msg: fmt.Sprintf("could not download %s: %s", pu.Redacted(), msg)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// The status line is the host's, or the proxy's refusal (whose
		// reason phrase says why): printable text only, and not much.
		return 0, "", &DownloadError{URL: u, Msg: fmt.Sprintf("could not download %s: the answer was %s", pu.Redacted(), printable(resp.Status, 300))}
	}
	if resp.ContentLength > m.cfg.MaxArchiveBytes {
		return 0, "", &DownloadError{URL: u, Msg: fmt.Sprintf("%s is %d MiB, over the %d MiB an archive may be", pu.Redacted(), resp.ContentLength>>20, m.cfg.MaxArchiveBytes>>20)}
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var n int64
	total := resp.ContentLength
	lastNote := time.Now()
	for {
		k, rerr := resp.Body.Read(buf)
		if k > 0 {
			if n+int64(k) > m.cfg.MaxArchiveBytes {
				return n, "", &DownloadError{URL: u, Msg: fmt.Sprintf("%s sent more than the %d MiB an archive may be", pu.Redacted(), m.cfg.MaxArchiveBytes>>20)}
			}
			if err := charge(int64(k)); err != nil {
				return n, "", err
			}
			if _, err := dst.Write(buf[:k]); err != nil {
				return n, "", diskError("save the download", err)
			}
			h.Write(buf[:k])
			n += int64(k)
			if progress != nil && time.Since(lastNote) >= m.cfg.ProgressEvery {
				lastNote = time.Now()
				if total > 0 {
					progress(fmt.Sprintf("downloaded %.1f of %.1f MiB", float64(n)/(1<<20), float64(total)/(1<<20)))
				} else {
					progress(fmt.Sprintf("downloaded %.1f MiB", float64(n)/(1<<20)))
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return n, "", ctx.Err()
			}
			return n, "", &DownloadError{URL: u, Msg: fmt.Sprintf("the download from %s broke off after %d bytes: %s", pu.Redacted(), n, reason(rerr))}
		}
	}
	if total > 0 && n != total {
		return n, "", &DownloadError{URL: u, Msg: fmt.Sprintf("%s sent %d bytes of the %d it announced", pu.Redacted(), n, total)}
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// printable is s with control characters and other non-ASCII as '?',
// cut at max bytes: a host's text goes into messages and logs.
func printable(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// reason is the useful end of a network error.
func reason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return printable(err.Error(), 300)
}

// diskError names a full disk plainly.
func diskError(what string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("pydist: could not %s: the disk holding the cache is full", what)
	}
	return fmt.Errorf("pydist: could not %s: %w", what, err)
}
