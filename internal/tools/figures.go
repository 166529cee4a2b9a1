package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/worker"
	"github.com/pysandbox/pysandbox/internal/workspace"
)

// FigureTemplate serves figures of one-shot runs that were too large to
// return inline (a session's go to its workspace instead).
const FigureTemplate = "pysandbox://figures/{id}"

const figurePrefix = "pysandbox://figures/"

// figureStore keeps the most recent oversized figures in memory, bounded
// in count and bytes: a one-shot run has no workspace to leave them in.
// Each belongs to the caller whose run drew it, as a session does: another
// caller who learns the link still cannot read it. The same store, with
// its own prefix and bounds, keeps runs' displays and whole output
// (outputs.go).
type figureStore struct {
	mu     sync.Mutex
	prefix string
	lim    storeLimits
	byID   map[string]storedFigure
	order  []string
	bytes  int
}

type storedFigure struct {
	png   []byte
	mime  string
	owner string
}

// storeLimits bound a store: in all, and what one owner holds.
type storeLimits struct{ items, bytes, ownerItems, ownerBytes int }

const (
	maxStoredFigures     = 32
	maxStoredFigureBytes = 64 << 20
	// An owner's share: what one run may draw (the worker sends at most
	// 16 figures, 16 MiB), so a run's links all stay readable.
	maxFiguresPerOwner     = 16
	maxFigureBytesPerOwner = 16 << 20
)

// drop forgets the i-th oldest figure. f.mu is held.
func (f *figureStore) drop(i int) {
	k := f.order[i]
	f.order = slices.Delete(f.order, i, i+1)
	f.bytes -= len(f.byID[k].png)
	delete(f.byID, k)
}

func newFigureStore() *figureStore {
	return newStore(figurePrefix, storeLimits{maxStoredFigures, maxStoredFigureBytes, maxFiguresPerOwner, maxFigureBytesPerOwner})
}

func newStore(prefix string, lim storeLimits) *figureStore {
	return &figureStore{prefix: prefix, lim: lim, byID: map[string]storedFigure{}}
}

// put stores png for owner; suffix ends its name before ".png" (with
// replicas, the replica's, as its session ids end: a read of the figure
// through another replica is routed here by it).
func (f *figureStore) put(png []byte, owner, suffix string) string {
	return f.putAs(png, "image/png", owner, suffix, ".png")
}

// putAs stores data of type mime for owner, under a random name that ends
// with suffix and then ext, and returns its URI.
func (f *figureStore) putAs(data []byte, mime, owner, suffix, ext string) string {
	// 128 random bits: for callers without a token, who share one
	// identity, the name is what keeps a figure its drawer's.
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:]) + suffix + ext
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byID[id] = storedFigure{png: data, mime: mime, owner: owner}
	f.order = append(f.order, id)
	f.bytes += len(data)
	// An owner over its share loses its own oldest figures first, so that
	// one caller's plots cannot push another's links out.
	n, size := 0, 0
	for _, k := range f.order {
		if fig := f.byID[k]; fig.owner == owner {
			n, size = n+1, size+len(fig.png)
		}
	}
	for i := 0; i < len(f.order) && (n > f.lim.ownerItems || size > f.lim.ownerBytes); {
		if k := f.order[i]; f.byID[k].owner == owner && k != id {
			n, size = n-1, size-len(f.byID[k].png)
			f.drop(i)
			continue
		}
		i++
	}
	// Past the store's bound, the owner holding the most loses its oldest.
	for len(f.order) > f.lim.items || f.bytes > f.lim.bytes {
		held := map[string]int{}
		top := ""
		for _, k := range f.order {
			o := f.byID[k].owner
			if held[o]++; held[o] > held[top] {
				top = o
			}
		}
		for i, k := range f.order {
			if f.byID[k].owner == top {
				f.drop(i)
				break
			}
		}
	}
	return f.prefix + id
}

// get returns the figure at uri if who owns it. Someone else's figure is
// not found, as an unknown one is, so its existence does not leak.
func (f *figureStore) get(uri, who string) ([]byte, bool) {
	data, _, ok := f.getAs(uri, who)
	return data, ok
}

// getAs is get with the data's MIME type.
func (f *figureStore) getAs(uri, who string) ([]byte, string, bool) {
	id, ok := strings.CutPrefix(uri, f.prefix)
	if !ok {
		return nil, "", false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fig, ok := f.byID[id]
	if !ok || fig.owner != who {
		return nil, "", false
	}
	return fig.png, fig.mime, true
}

// figureRef is the part of a figure's URI that names the replica holding
// it (as a session id does), for routing; "" for a URI that is not a
// figure's.
func figureRef(uri string) string {
	id, ok := strings.CutPrefix(uri, figurePrefix)
	if !ok {
		return ""
	}
	return strings.TrimSuffix(id, ".png")
}

// figureSuffix ends the names of the figures this server stores: with
// replicas, this one's, as its session ids end.
func (s *server) figureSuffix() string {
	if s.cl == nil {
		return ""
	}
	return s.cl.SessionSuffix()
}

func (s *server) addFigureResources(srv *mcp.Server) {
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "figure",
		Title:       "A plot too large to return inline",
		URITemplate: FigureTemplate,
		MIMEType:    "image/png",
		Description: "A matplotlib figure from a run_python call without a session, kept for a limited time and readable only by the caller whose run drew it.",
	}, routedResource(s, figureRef, s.readFigure))
}

// readFigure serves resources/read for the figures this server stores.
func (s *server) readFigure(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	png, ok := s.figures.get(req.Params.URI, identity(req))
	if !ok {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	if int64(len(png)) > s.maxDownload {
		return nil, tooLarge(fmt.Sprintf("this figure is %d bytes, more than the %s this server returns in one reply (--max-reply); draw it smaller (figsize, dpi)", len(png), byteSize(s.maxDownload, true)))
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "image/png", Blob: png}}}, nil
}

// figureContent turns a run's figures into image content, or into links
// for those too large to inline: in a session's workspace (figures/), or
// in the in-memory store for one-shot runs, readable by owner alone.
//
// room is what the reply has left for them, as encoded JSON: an image that
// would not fit (base64 takes 4/3 of its bytes) becomes a link too.
func (s *server) figureContent(res *RunPythonOutput, sessionID string, run int, owner string, room int64) []mcp.Content {
	var out []mcp.Content
	linked := 0
	for i := range res.Figures {
		fig := &res.Figures[i]
		if len(fig.PNG) == 0 {
			continue
		}
		encoded := int64(len(fig.PNG))*4/3 + 256
		inline := !fig.TooLarge && int64(len(fig.PNG)) <= s.maxInline
		if inline && encoded <= room {
			room -= encoded
			out = append(out, &mcp.ImageContent{Data: fig.PNG, MIMEType: "image/png"})
			continue
		}
		if inline {
			linked++
		}
		if sessionID != "" {
			p := fmt.Sprintf("figures/run%d-figure%d.png", run, i+1)
			err := s.sessions.Workspace(sessionID, func(d *workspace.Dir) error { return d.Write(p, fig.PNG, int64(len(fig.PNG))+1) })
			if err == nil {
				fig.URI = fileURI(sessionID, p)
			}
		}
		if fig.URI == "" {
			fig.URI = s.figures.put(fig.PNG, owner, s.figureSuffix())
		}
		size := int64(len(fig.PNG))
		out = append(out, &mcp.ResourceLink{URI: fig.URI, Name: fmt.Sprintf("figure %d (%dx%d)", i+1, fig.Width, fig.Height), MIMEType: "image/png", Size: &size})
		room -= 512
	}
	if linked > 0 {
		res.Message = engine.JoinMessage(res.Message, fmt.Sprintf("%d figure(s) did not fit the reply limit (--max-reply) and are returned as resource links; read them with resources/read", linked))
	}
	if res.FiguresOmitted > 0 {
		res.Message = engine.JoinMessage(res.Message, fmt.Sprintf("%d more figure(s) were left open and not returned: a run returns at most %d; close those you do not need (plt.close), or save the rest with savefig and download them", res.FiguresOmitted, worker.MaxFigures))
	}
	return out
}
