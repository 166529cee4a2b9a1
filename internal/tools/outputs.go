package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/workspace"
)

// A run's reply shows the head and tail of what it printed; the whole of
// it (as the engine captured it: --max-output bytes a stream, its own head
// and tail) stays readable. A session's goes to a file in its workspace
// (OutputDir); a one-shot run has none, so its output is kept in memory
// here, readable by its caller alone, as oversized figures are. Displays
// (HTML, SVG, Markdown, JSON, LaTeX) are kept the same way, each under a
// name of its own, so that the URI of every embedded resource a reply
// carries can be read back.
const (
	OutputTemplate  = "pysandbox://output/{id}"
	DisplayTemplate = "pysandbox://display/{id}"
	outputPrefix    = "pysandbox://output/"
	displayPrefix   = "pysandbox://display/"
	// OutputDir is where a session's whole output goes, in its workspace.
	OutputDir = ".pysandbox/output"
)

// Stored outputs and displays: a run keeps at most two outputs and 32
// displays (4 MiB, the worker's bounds), so an owner's share holds a few
// runs' worth.
//
// A display can hold several kinds of data (HTML, SVG, Markdown, JSON,
// LaTeX, ...), each an item: one run's 32 displays of up to 7 kinds must
// all fit an owner's share, or its own links would be broken at once.
var (
	outputLimits  = storeLimits{items: 128, bytes: 128 << 20, ownerItems: 16, ownerBytes: 32 << 20}
	displayLimits = storeLimits{items: 1024, bytes: 64 << 20, ownerItems: 256, ownerBytes: 16 << 20}
)

// keptRuns is how many of a session's last runs keep their whole output
// in its workspace.
const keptRuns = 8

// storedRef is the part of a stored output's or display's name that names
// the replica holding it, for routing: the name is 32 hex digits, the
// replica's suffix, then "-" and what it is (stdout.txt, display.html).
func storedRef(prefix string) func(string) string {
	return func(uri string) string {
		id, ok := strings.CutPrefix(uri, prefix)
		if !ok {
			return ""
		}
		if i := strings.LastIndexByte(id, '-'); i > 0 {
			return id[:i]
		}
		return id
	}
}

func (s *server) addOutputResources(srv *mcp.Server) {
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "output",
		Title:       "The whole output of a run",
		URITemplate: OutputTemplate,
		MIMEType:    "text/plain",
		Description: "What a run_python call without a session printed, as the server captured it, when its reply showed only the head and tail; kept for a limited time and readable only by the caller whose run printed it.",
	}, routedResource(s, storedRef(outputPrefix), s.readStored(s.outputs)))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "display",
		Title:       "A rich output of a run",
		URITemplate: DisplayTemplate,
		Description: "An HTML table, SVG, Markdown, JSON or LaTeX a run displayed; kept for a limited time and readable only by the caller whose run made it.",
	}, routedResource(s, storedRef(displayPrefix), s.readStored(s.displays)))
}

// readStored serves resources/read from a store: text as text, anything
// else as a blob.
func (s *server) readStored(st *figureStore) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		data, mime, ok := st.getAs(req.Params.URI, identity(req))
		if !ok {
			return nil, mcp.ResourceNotFoundError(req.Params.URI)
		}
		if int64(len(data)) > s.maxDownload {
			return nil, tooLarge(fmt.Sprintf("this resource is %d bytes, more than the %s this server returns in one reply (--max-reply)", len(data), byteSize(s.maxDownload, true)))
		}
		c := &mcp.ResourceContents{URI: req.Params.URI, MIMEType: mime}
		if textMIME(mime) {
			c.Text = string(data)
		} else {
			c.Blob = data
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
	}
}

func textMIME(mime string) bool {
	return strings.HasPrefix(mime, "text/") || mime == "application/json" || mime == "image/svg+xml"
}

// keepOutput keeps the whole of a stream whose reply shows less: in the
// session's workspace, or in the store for one-shot runs. It returns where
// it went, or "" (with why) when it could not be kept.
func (s *server) keepOutput(data, stream, sessionID string, run int, owner string) (uri, why string) {
	if sessionID != "" {
		p := fmt.Sprintf("%s/run-%d-%s.txt", OutputDir, run, stream)
		err := s.sessions.Workspace(sessionID, func(d *workspace.Dir) error {
			// Only the last keptRuns runs' output stays: older files
			// would fill the workspace, unseen (list_files hides it).
			if run > keptRuns {
				d.Remove(fmt.Sprintf("%s/run-%d-%s.txt", OutputDir, run-keptRuns, stream))
			}
			return d.Write(p, []byte(data), int64(len(data))+1)
		})
		if errors.Is(err, workspace.ErrFull) {
			return "", "the session's workspace is full (delete files in /work, or use a new session)"
		}
		if err != nil {
			return "", err.Error()
		}
		return fileURI(sessionID, p), ""
	}
	if len(data) > outputLimits.ownerBytes {
		return "", fmt.Sprintf("it is larger than the %d MiB the server keeps", outputLimits.ownerBytes>>20)
	}
	return s.outputs.putAs([]byte(data), "text/plain; charset=utf-8", owner, s.figureSuffix(), "-"+stream+".txt"), ""
}

// keepDisplay keeps one display's data, for a link to it or the URI of
// the resource that embeds it.
func (s *server) keepDisplay(data []byte, mime, owner string) string {
	ext := map[string]string{"text/html": ".html", "image/svg+xml": ".svg", "text/markdown": ".md", "application/json": ".json", "text/latex": ".tex", "image/png": ".png", "image/jpeg": ".jpg"}[mime]
	return s.displays.putAs(data, mime, owner, s.figureSuffix(), "-display"+ext)
}
