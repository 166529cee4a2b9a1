package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/pysandbox/pysandbox/internal/govern"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/workspace"
)

// FileTemplate is the resource template every session file is readable at.
// The path is one template variable, so a nested path is percent-encoded
// ("data%2Fout.csv"), as RFC 6570 simple expansion does.
const FileTemplate = "pysandbox://sessions/{session_id}/files/{path}"

const filePrefix = "pysandbox://sessions/"

// fileURI is the resource URI of a session file.
func fileURI(sessionID, p string) string {
	return filePrefix + url.PathEscape(sessionID) + "/files/" + url.PathEscape(p)
}

// parseFileURI splits a session file URI; it accepts the path encoded or not.
func parseFileURI(uri string) (sessionID, p string, ok bool) {
	rest, found := strings.CutPrefix(uri, filePrefix)
	if !found {
		return "", "", false
	}
	id, rawPath, found := strings.Cut(rest, "/files/")
	if !found || id == "" || rawPath == "" {
		return "", "", false
	}
	id, err1 := url.PathUnescape(id)
	p, err2 := url.PathUnescape(rawPath)
	if err1 != nil || err2 != nil {
		return "", "", false
	}
	return id, p, true
}

// UploadFileInput is upload_file's input.
type UploadFileInput struct {
	SessionID     string `json:"session_id" jsonschema:"The session to upload into."`
	Path          string `json:"path" jsonschema:"Where to write, relative to the session's working directory /work, e.g. data/input.csv. Parent directories are created."`
	Content       string `json:"content,omitempty" jsonschema:"The file's content as UTF-8 text (\"\" for an empty file). Use content_base64 instead for binary files. One of the two is required."`
	ContentBase64 string `json:"content_base64,omitempty" jsonschema:"The file's content, base64-encoded (for binary files)."`
}

// FileOutput describes one file written or read.
type FileOutput struct {
	Outcome
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	MIMEType string `json:"mime_type,omitempty"`
	URI      string `json:"uri"`
	// Inline is true when download_file returned the content itself, false
	// when it returned a link to read with resources/read.
	Inline bool `json:"inline"`
	// Resumed: see RunPythonOutput.Resumed.
	Resumed string `json:"resumed,omitempty" jsonschema:"set when the session was paused and this call resumed it: what was restored and what was not"`
}

func (o *FileOutput) setResumed(s string) { o.Resumed = s }

// ListFilesInput is list_files' input.
type ListFilesInput struct {
	SessionID     string `json:"session_id" jsonschema:"The session whose files to list."`
	Path          string `json:"path,omitempty" jsonschema:"A directory relative to /work to list (default: all of /work)."`
	IncludeHidden bool   `json:"include_hidden,omitempty" jsonschema:"Also list hidden entries, whose names begin with a dot (.cache, .config: what libraries keep there), and what they hold. Default false: they are left out and counted."`
}

// ListFilesOutput is list_files' result.
type ListFilesOutput struct {
	Outcome
	Files     []workspace.FileInfo `json:"files"`
	Truncated bool                 `json:"truncated"`
	// Hidden counts the hidden entries left out (include_hidden was false).
	Hidden int `json:"hidden,omitempty"`
	// Resumed: see RunPythonOutput.Resumed.
	Resumed string `json:"resumed,omitempty" jsonschema:"set when the session was paused and this call resumed it: what was restored and what was not"`
}

func (o *ListFilesOutput) setResumed(s string) { o.Resumed = s }

// DownloadFileInput is download_file's input.
type DownloadFileInput struct {
	SessionID string `json:"session_id" jsonschema:"The session to read from."`
	Path      string `json:"path" jsonschema:"The file, relative to the session's working directory /work."`
}

func (s *server) addFileTools(srv *mcp.Server) {
	addTool(s, srv, &mcp.Tool{
		Name:  "upload_file",
		Title: "Upload a file into a session",
		Description: fmt.Sprintf("Write a file into a session's working directory (/work), creating parent directories; an existing file is replaced. "+
			"Pass text as content, or binary data as content_base64. At most %d MiB per file; the workspace as a whole is capped too. Code in the session then opens it by its relative path.", s.maxUpload>>20),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, s.uploadFile)
	addTool(s, srv, &mcp.Tool{
		Name:        "list_files",
		Title:       "List a session's files",
		Description: fmt.Sprintf("List the files in a session's working directory (/work), recursively: path, type, size and modification time. Symbolic links are listed, not followed. Hidden entries (names beginning with a dot, such as the .cache libraries write) are left out unless include_hidden is true. At most %d entries.", maxListEntries),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.listFiles)
	addTool(s, srv, &mcp.Tool{
		Name:  "download_file",
		Title: "Download a file from a session",
		Description: fmt.Sprintf("Read a file from a session's working directory (/work). Files up to %d KiB come back inline (text as text, anything else as base64); larger ones, up to %s, as a resource link to read with resources/read; a larger file cannot be read in one reply, so have the session split or compress it first. "+
			"Every session file is also a resource: %s.", s.maxInline>>10, byteSize(s.maxDownload, false), FileTemplate),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.downloadFile)
	s.addFileResource(srv)
}

// addFileResource makes session files readable as resources
// (FileTemplate), under download_file's rule (see readResource).
func (s *server) addFileResource(srv *mcp.Server) {
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "session-file",
		Title:       "A file in a session's working directory",
		URITemplate: FileTemplate,
		Description: "A file in a pysandbox session's /work. The path is percent-encoded as one segment (data%2Fout.csv).",
	}, routedResource(s, fileSessionRef, s.readFileResource))
}

// fileSessionRef is the session a file URI names, for routing.
func fileSessionRef(uri string) string {
	id, _, _ := parseFileURI(uri)
	return id
}

const maxListEntries = 1000

func (s *server) uploadFile(ctx context.Context, req *mcp.CallToolRequest, in UploadFileInput) (*mcp.CallToolResult, *FileOutput, error) {
	if _, err := s.ownAwake(ctx, req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	p, err := workspace.CleanPath(in.Path)
	if err != nil {
		return nil, nil, errorResult(err.Error())
	}
	var data []byte
	switch {
	case in.Content == "" && in.ContentBase64 == "" && !argGiven(req.Params.Arguments, "content") && !argGiven(req.Params.Arguments, "content_base64"):
		// Both fields are optional in the schema (either will do), so the
		// input type cannot tell a missing content from an empty one: the
		// raw arguments can. A forgotten argument is not an empty file.
		return nil, nil, errorResult("pass the file's content: content (text) or content_base64 (binary). For an empty file, pass content \"\".")
	case in.Content != "" && in.ContentBase64 != "":
		return nil, nil, errorResult("pass either content (text) or content_base64 (binary), not both.")
	case in.ContentBase64 != "":
		if int64(base64.StdEncoding.DecodedLen(len(in.ContentBase64))) > s.maxUpload+3 {
			return nil, nil, errorResult(fmt.Sprintf("the file is larger than the %d MiB upload limit. Compress it, or upload it in parts and join them in the session (open(path, 'ab')).", s.maxUpload>>20))
		}
		if data, err = base64.StdEncoding.DecodeString(in.ContentBase64); err != nil {
			return nil, nil, errorResult(fmt.Sprintf("content_base64 is not valid base64: %v.", err))
		}
	default:
		data = []byte(in.Content)
	}
	if int64(len(data)) > s.maxUpload {
		return nil, nil, errorResult(fmt.Sprintf("the file is %d bytes, above the %d MiB upload limit. Compress it, or upload it in parts and join them in the session (open(path, 'ab')).", len(data), s.maxUpload>>20))
	}
	err = s.sessions.Workspace(in.SessionID, func(d *workspace.Dir) error { return d.Write(p, data, s.maxUpload) })
	if err != nil {
		return nil, nil, fileError(err, p)
	}
	out := &FileOutput{Path: p, Size: int64(len(data)), MIMEType: mimeType(p, data), URI: fileURI(in.SessionID, p)}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %s (%d bytes) to /work/%s", p, len(data), p)}}}, out, nil
}

func (s *server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, *ListFilesOutput, error) {
	if _, err := s.ownAwake(ctx, req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	dir := in.Path
	if dir != "" && dir != "." {
		var err error
		if dir, err = workspace.CleanPath(dir); err != nil {
			return nil, nil, errorResult(err.Error())
		}
	}
	out := &ListFilesOutput{}
	err := s.sessions.Workspace(in.SessionID, func(d *workspace.Dir) error {
		var err error
		if in.IncludeHidden {
			out.Files, out.Truncated, err = d.List(dir, maxListEntries)
		} else {
			out.Files, out.Hidden, out.Truncated, err = d.ListVisible(dir, maxListEntries)
		}
		return err
	})
	if err != nil {
		return nil, nil, fileError(err, dir)
	}
	if out.Files == nil {
		out.Files = []workspace.FileInfo{}
	}
	text := listText(out, dir)
	// Names are hostile: 1000 entries of 8 KiB paths full of characters
	// JSON escapes six times over would make a reply of ~100 MB. Keep the
	// entries that fit the reply limit (structured and text together).
	for n := len(out.Files); encodedLen(out)+encodedLen(text) > s.maxReply-replyOverhead && n > 0; {
		n /= 2
		out.Files, out.Truncated = out.Files[:n], true
		text = listText(out, dir)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
}

// listText is list_files' text; dir is the listed directory, relative to
// /work ("" or "." for /work itself).
func listText(out *ListFilesOutput, dir string) string {
	var b strings.Builder
	where := "/work"
	if dir != "" && dir != "." {
		where += "/" + workspace.DisplayPath(dir)
	}
	fmt.Fprintf(&b, "%d entries in %s", len(out.Files), where)
	if out.Truncated {
		b.WriteString(" (truncated: list a subdirectory to see the rest)")
	}
	if out.Hidden == 1 {
		b.WriteString("; 1 hidden entry (its name begins with a dot) was left out: pass include_hidden: true to list it")
	} else if out.Hidden > 1 {
		fmt.Fprintf(&b, "; %d hidden entries (names beginning with a dot) were left out: pass include_hidden: true to list them", out.Hidden)
	}
	b.WriteString("\n")
	for _, f := range out.Files {
		fmt.Fprintf(&b, "%-7s %10d  %s  %s\n", f.Type, f.Size, f.ModTime.Format("2006-01-02T15:04:05Z07:00"), workspace.DisplayPath(f.Path))
	}
	return b.String()
}

// encodedLen is v's size as JSON, as it goes on the wire.
func encodedLen(v any) int64 {
	b, _ := json.Marshal(v)
	return int64(len(b))
}

func (s *server) downloadFile(ctx context.Context, req *mcp.CallToolRequest, in DownloadFileInput) (*mcp.CallToolResult, *FileOutput, error) {
	if _, err := s.ownAwake(ctx, req, in.SessionID); err != nil {
		return nil, nil, sessionError(ctx, err)
	}
	p, err := workspace.CleanPath(in.Path)
	if err != nil {
		return nil, nil, errorResult(err.Error())
	}
	var data []byte
	var info workspace.FileInfo
	err = s.sessions.Workspace(in.SessionID, func(d *workspace.Dir) error {
		var err error
		data, info, err = d.Read(p, s.maxInline)
		return err
	})
	uri := fileURI(in.SessionID, p)
	if errors.Is(err, workspace.ErrTooLarge) && info.Size > s.maxDownload {
		// Not even resources/read returns it: say so now, not after a
		// second request.
		return nil, nil, errorResult(fmt.Sprintf("%s is %d bytes, more than the %s this server returns in one reply (its --max-reply). Have the session split it into parts of at most that size (or compress it), then download each part.", p, info.Size, byteSize(s.maxDownload, true)))
	}
	if errors.Is(err, workspace.ErrTooLarge) {
		mt := mimeType(p, nil)
		out := &FileOutput{Path: p, Size: info.Size, MIMEType: mt, URI: uri}
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: fmt.Sprintf("%s is %d bytes, too large to return inline; read it with resources/read at %s", p, info.Size, uri)},
			&mcp.ResourceLink{URI: uri, Name: path.Base(p), MIMEType: mt, Size: &info.Size},
		}}, out, nil
	}
	if err != nil {
		return nil, nil, fileError(err, p)
	}
	mt := mimeType(p, data)
	out := &FileOutput{Path: p, Size: int64(len(data)), MIMEType: mt, URI: uri, Inline: true}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.EmbeddedResource{Resource: s.contents(uri, mt, data)}}}, out, nil
}

// readFileResource serves resources/read for session files.
func (s *server) readFileResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, raw, ok := parseFileURI(uri)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	p, err := workspace.CleanPath(raw)
	if err != nil || s.ownSession(req, id) != nil {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	var data []byte
	err = s.sessions.Workspace(id, func(d *workspace.Dir) error {
		var err error
		data, _, err = d.Read(p, s.maxDownload)
		return err
	})
	if err != nil {
		if errors.Is(err, workspace.ErrTooLarge) {
			return nil, tooLarge(fmt.Sprintf("%s is larger than the %s this server returns in one reply (its --max-reply); have the session split it into parts of at most that size, or compress it", p, byteSize(s.maxDownload, true)))
		}
		return nil, mcp.ResourceNotFoundError(uri)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{s.contents(uri, mimeType(p, data), data)}}, nil
}

// contents is text when the data is UTF-8 text whose JSON fits the reply
// limit (control characters take six bytes each once escaped), a blob
// otherwise (base64: 4/3 of the bytes, which maxDownload keeps in bounds).
func (s *server) contents(uri, mt string, data []byte) *mcp.ResourceContents {
	if isText(data) && encodedLen(string(data)) <= s.maxReply-replyOverhead {
		return &mcp.ResourceContents{URI: uri, MIMEType: mt, Text: string(data)}
	}
	return &mcp.ResourceContents{URI: uri, MIMEType: mt, Blob: data}
}

func isText(data []byte) bool {
	return utf8.Valid(data) && !bytes.ContainsRune(data, 0)
}

func mimeType(p string, data []byte) string {
	if mt := mime.TypeByExtension(path.Ext(p)); mt != "" {
		return mt
	}
	if data != nil {
		return http.DetectContentType(data)
	}
	return "application/octet-stream"
}

// fileError turns a file operation's failure into advice.
func fileError(err error, p string) *govern.Refusal {
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return errorResult(fmt.Sprintf("%s does not exist in /work; list_files shows what does.", p))
	case errors.Is(err, workspace.ErrNotRegular):
		return errorResult(fmt.Sprintf("%s is not a regular file (a directory, pipe or device); only regular files can be read.", p))
	case errors.Is(err, workspace.ErrSymlink):
		return errorResult(fmt.Sprintf("%s goes through a symbolic link; links are not followed for file transfers. Use the real path.", p))
	case errors.Is(err, workspace.ErrFull):
		return errorResult(fmt.Sprintf("The session's workspace is full: %v. Delete files in the session (os.remove) or use a new session.", err))
	case errors.Is(err, workspace.ErrTooLarge):
		return errorResult(fmt.Sprintf("%s: %v", p, err))
	}
	if r := sessionError(context.Background(), err); r != nil {
		return r
	}
	return errorResult(err.Error())
}

// argGiven reports whether the call's arguments set key to something other
// than null.
func argGiven(raw json.RawMessage, key string) bool {
	var args map[string]json.RawMessage
	if json.Unmarshal(raw, &args) != nil {
		return false
	}
	v, ok := args[key]
	return ok && string(bytes.TrimSpace(v)) != "null"
}

// tooLarge refuses a resources/read of something larger than a reply may
// be, as a request the client can change (invalid params), not as the
// SDK's code 0 that a plain error becomes.
func tooLarge(msg string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}

// byteSize is n bytes for a message: exact below a KiB, else in KiB or
// MiB with one decimal (2.9 MiB, not a rounded-down 2), and with exact
// the byte count besides, for a limit the caller must stay within.
func byteSize(n int64, exact bool) string {
	unit, name := int64(1<<20), "MiB"
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		unit, name = 1<<10, "KiB"
	}
	if exact {
		return fmt.Sprintf("%.1f %s (%d bytes)", float64(n)/float64(unit), name, n)
	}
	return fmt.Sprintf("%.1f %s", float64(n)/float64(unit), name)
}
