package tools

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pysandbox/pysandbox/internal/interp"
)

func newSession(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	res, out := call(t, cs, "create_session", map[string]any{"ttl_seconds": 120})
	if res.IsError {
		t.Fatalf("create_session: %s", text(res))
	}
	id, _ := out["session_id"].(string)
	if id == "" || out["expires_at"] == nil {
		t.Fatalf("create_session output %v", out)
	}
	t.Cleanup(func() {
		cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "close_session", Arguments: map[string]any{"session_id": id}})
	})
	return id
}

func TestSessionWorkflow(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)

	// Upload text and binary, nested.
	res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "data/in.csv", "content": "a,b\n1,2\n3,4\n"})
	if res.IsError {
		t.Fatalf("upload text: %s", text(res))
	}
	bin := []byte{0, 1, 2, 255, 254, 'P', 'K'}
	res, _ = call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "blob.bin", "content_base64": base64.StdEncoding.EncodeToString(bin)})
	if res.IsError {
		t.Fatalf("upload binary: %s", text(res))
	}

	// Analyse in two steps: state persists.
	res, out := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import csv\nrows = list(csv.DictReader(open('data/in.csv')))\nlen(rows)"})
	if res.IsError || out["return_value"] != 2.0 {
		t.Fatalf("run 1: %s", text(res))
	}
	res, out = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "total = sum(int(r['a']) + int(r['b']) for r in rows)\nopen('out/total.txt', 'w') if False else None\nimport os\nos.makedirs('out', exist_ok=True)\nopen('out/total.txt', 'w').write(str(total))\ntotal"})
	if res.IsError || out["return_value"] != 10.0 {
		t.Fatalf("run 2: %s", text(res))
	}

	// List.
	res, out = call(t, cs, "list_files", map[string]any{"session_id": id})
	if res.IsError {
		t.Fatal(text(res))
	}
	var paths []string
	for _, f := range out["files"].([]any) {
		paths = append(paths, f.(map[string]any)["path"].(string))
	}
	if got := strings.Join(paths, ","); got != "blob.bin,data,data/in.csv,out,out/total.txt" {
		t.Errorf("list_files: %s", got)
	}

	// Download text (embedded text resource) and binary (blob).
	res, out = call(t, cs, "download_file", map[string]any{"session_id": id, "path": "out/total.txt"})
	er, ok := res.Content[0].(*mcp.EmbeddedResource)
	if res.IsError || !ok || er.Resource.Text != "10" || out["inline"] != true {
		t.Fatalf("download text: %s %v", text(res), out)
	}
	res, _ = call(t, cs, "download_file", map[string]any{"session_id": id, "path": "blob.bin"})
	er, ok = res.Content[0].(*mcp.EmbeddedResource)
	if !ok || !bytes.Equal(er.Resource.Blob, bin) {
		t.Fatalf("download binary: %#v", res.Content[0])
	}

	// The same file through the resource template.
	tl, err := cs.ListResourceTemplates(context.Background(), nil)
	if err != nil || len(tl.ResourceTemplates) == 0 {
		t.Fatalf("resource templates: %v %v", err, tl)
	}
	found := false
	for _, rt := range tl.ResourceTemplates {
		found = found || rt.URITemplate == FileTemplate
	}
	if !found {
		t.Errorf("template %s not listed", FileTemplate)
	}
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, "data/in.csv")})
	if err != nil || rr.Contents[0].Text != "a,b\n1,2\n3,4\n" {
		t.Fatalf("resources/read: %v %+v", err, rr)
	}
	if _, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, "nope.txt")}); err == nil {
		t.Error("resources/read of a missing file succeeded")
	}

	// list_sessions, then close: files gone, id refused with advice.
	res, out = call(t, cs, "list_sessions", map[string]any{})
	if res.IsError || len(out["sessions"].([]any)) != 1 {
		t.Fatalf("list_sessions: %s", text(res))
	}
	res, _ = call(t, cs, "close_session", map[string]any{"session_id": id})
	if res.IsError {
		t.Fatal(text(res))
	}
	res, _ = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "1"})
	if !res.IsError || !strings.Contains(text(res), "create_session") {
		t.Errorf("run on a closed session: %s", text(res))
	}
	res, _ = call(t, cs, "download_file", map[string]any{"session_id": id, "path": "out/total.txt"})
	if !res.IsError {
		t.Error("download from a closed session succeeded")
	}
}

func TestLargeDownloadIsALink(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	call(t, cs, "run_python", map[string]any{"session_id": id, "code": "open('big.bin', 'wb').write(b'x' * (2 << 20))\nopen('huge.bin', 'wb').write(b'x' * (3 << 20))"})
	res, out := call(t, cs, "download_file", map[string]any{"session_id": id, "path": "big.bin"})
	var link *mcp.ResourceLink
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok {
			link = l
		}
	}
	if res.IsError || link == nil || out["inline"] != false || out["size"] != float64(2<<20) {
		t.Fatalf("%s %v", text(res), out)
	}
	rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link.URI})
	if err != nil || len(rr.Contents[0].Text)+len(rr.Contents[0].Blob) != 2<<20 {
		t.Fatalf("reading the link: %v", err)
	}
	// A file whose base64 would not fit the 4 MiB reply limit is refused
	// with a reason, not sent to break the client.
	_, err = cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, "huge.bin")})
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("reading a file beyond the reply limit: %v", err)
	}
}

// Paths are hostile, and so is code in the session, which can plant links.
func TestFilePathAttacks(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	for _, p := range []string{"/etc/passwd", "../x", "a/../../x", "a\x00b", "", "..", "./../../etc/shadow"} {
		for _, tool := range []string{"upload_file", "download_file"} {
			res, _ := call(t, cs, tool, map[string]any{"session_id": id, "path": p, "content": "x"})
			if !res.IsError {
				t.Errorf("%s %q accepted", tool, p)
			}
		}
	}
	// Code in the session plants links to host files and directories.
	res, _ := call(t, cs, "run_python", map[string]any{"session_id": id, "code": `
import os
os.symlink('/etc/passwd', 'passwd')
os.symlink('/etc', 'etc')
os.symlink('../../../../etc/hostname', 'rel')
os.symlink('/proc/self/root/etc/passwd', 'magic')
os.symlink('/tmp', 'up')
`})
	if res.IsError {
		t.Fatal(text(res))
	}
	for _, p := range []string{"passwd", "etc/passwd", "rel", "magic", "etc/shadow"} {
		res, _ := call(t, cs, "download_file", map[string]any{"session_id": id, "path": p})
		if !res.IsError || strings.Contains(text(res), "root:") {
			t.Errorf("download %s: %s", p, text(res))
		}
		if rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: fileURI(id, p)}); err == nil {
			t.Errorf("resources/read %s returned %q", p, rr.Contents[0].Text)
		}
	}
	// Uploading through a planted link must not write outside.
	res, _ = call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "up/evil.txt", "content": "x"})
	if !res.IsError {
		t.Error("upload through a symlinked directory succeeded")
	}
	res, _ = call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "passwd", "content": "owned"})
	if !res.IsError {
		// Replacing the link itself with a file inside /work is fine; the
		// host file must be untouched either way.
		t.Log("upload over a final symlink replaced the link")
	}
	if host, _ := readHostFile("/etc/passwd"); strings.Contains(host, "owned") {
		t.Fatal("the host's /etc/passwd was modified")
	}
}

func TestPlotsComeBackAsImages(t *testing.T) {
	cs := connect(t, nil)
	code := "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()\n"
	// One-shot.
	res, out := call(t, cs, "run_python", map[string]any{"code": code})
	if res.IsError || strings.Contains(out["stderr"].(string), "non-interactive") {
		t.Fatalf("%s", text(res))
	}
	img := firstImage(res)
	if img == nil || !bytes.HasPrefix(img.Data, []byte("\x89PNG")) || img.MIMEType != "image/png" {
		t.Fatalf("no PNG image in %#v", res.Content)
	}
	if figs, _ := out["figures"].([]any); len(figs) != 1 {
		t.Errorf("figures %v", out["figures"])
	}
	// In a session, and closed afterwards: the next run returns none.
	id := newSession(t, cs)
	res, _ = call(t, cs, "run_python", map[string]any{"session_id": id, "code": code + "fig2 = plt.figure()\nplt.bar([1, 2], [3, 4])\n"})
	n := 0
	for _, c := range res.Content {
		if _, ok := c.(*mcp.ImageContent); ok {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d images, want 2", n)
	}
	res, _ = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "plt.get_fignums()"})
	if firstImage(res) != nil || !strings.Contains(text(res), "[]") {
		t.Errorf("figures not closed after the run: %s", text(res))
	}
}

// A figure larger than the inline cap comes back as a link, in the
// session's workspace or, for a one-shot run, in the server's figure store.
func TestLargePlotIsALink(t *testing.T) {
	cs := connectWith(t, nil, func(o *Options) { o.MaxInlineBytes = 2048 })
	code := "import matplotlib.pyplot as plt\nplt.plot(range(100))\n"
	for _, session := range []bool{false, true} {
		args := map[string]any{"code": code}
		if session {
			args["session_id"] = newSession(t, cs)
		}
		res, out := call(t, cs, "run_python", args)
		if res.IsError || firstImage(res) != nil {
			t.Fatalf("session %v: %s", session, text(res))
		}
		var link *mcp.ResourceLink
		for _, c := range res.Content {
			if l, ok := c.(*mcp.ResourceLink); ok {
				link = l
			}
		}
		figs, _ := out["figures"].([]any)
		if link == nil || len(figs) != 1 || figs[0].(map[string]any)["uri"] != link.URI {
			t.Fatalf("session %v: no link: %s %v", session, text(res), out["figures"])
		}
		if session != strings.HasPrefix(link.URI, filePrefix) {
			t.Errorf("session %v: link %s", session, link.URI)
		}
		rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link.URI})
		if err != nil || !bytes.HasPrefix(rr.Contents[0].Blob, []byte("\x89PNG")) {
			t.Fatalf("reading %s: %v", link.URI, err)
		}
	}
}

func firstImage(res *mcp.CallToolResult) *mcp.ImageContent {
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			return img
		}
	}
	return nil
}

// The walkthrough of docs/tools.md, call for call.
func TestReadmeWalkthrough(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	res, _ := call(t, cs, "upload_file", map[string]any{"session_id": id, "path": "data/sales.csv", "content": "month,units\n1,10\n2,14\n3,9\n"})
	if res.IsError {
		t.Fatal(text(res))
	}
	res, out := call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import pandas as pd\ndf = pd.read_csv('data/sales.csv')\ndf.describe()"})
	if res.IsError || !strings.Contains(out["return_text"].(string), "mean") {
		t.Fatalf("describe: %s %v", text(res), out["return_text"])
	}
	res, _ = call(t, cs, "run_python", map[string]any{"session_id": id, "code": "df['units'].plot(kind='bar')\nimport matplotlib.pyplot as plt\nplt.savefig('chart.png')\nplt.show()"})
	if res.IsError || firstImage(res) == nil {
		t.Fatalf("plot: %s", text(res))
	}
	res, _ = call(t, cs, "download_file", map[string]any{"session_id": id, "path": "chart.png"})
	er, ok := res.Content[0].(*mcp.EmbeddedResource)
	if res.IsError || !ok || !bytes.HasPrefix(er.Resource.Blob, []byte("\x89PNG")) || er.Resource.MIMEType != "image/png" {
		t.Fatalf("download chart: %s", text(res))
	}
	if res, _ := call(t, cs, "close_session", map[string]any{"session_id": id}); res.IsError {
		t.Fatal(text(res))
	}
}

// TestRefusalHasNoPlaceholders: a refused call's structured result has
// its status and message, and no made-up value where a real one would be
// (an expiry of 0001-01-01 read as a date).
func TestRefusalHasNoPlaceholders(t *testing.T) {
	cs := connect(t, nil)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"create_session", map[string]any{"dependencies": []any{"not a requirement!"}}},
		{"pause_session", map[string]any{"session_id": "s-nonesuch"}},
	} {
		res, out := call(t, cs, c.tool, c.args)
		if !res.IsError || out["status"] != "invalid_request" || out["message"] == "" {
			t.Errorf("%s: %s %v", c.tool, text(res), out)
		}
		if v, ok := out["expires_at"]; ok {
			t.Errorf("%s: expires_at %v in a refusal", c.tool, v)
		}
	}
}

// TestCloseEndedSession: closing a session whose worker has died is not
// a failure: there is nothing left to close, and the answer says why.
func TestCloseEndedSession(t *testing.T) {
	cs := connect(t, nil)
	id := newSession(t, cs)
	call(t, cs, "run_python", map[string]any{"session_id": id, "code": "import os\nos._exit(0)"})
	for range 2 {
		res, out := call(t, cs, "close_session", map[string]any{"session_id": id})
		if res.IsError || out["closed"] != false || !strings.Contains(text(res), "had already ended") {
			t.Errorf("close of an ended session: %s %v", text(res), out)
		}
	}
	// Closing twice is the same: the second close finds it closed.
	id = newSession(t, cs)
	if res, out := call(t, cs, "close_session", map[string]any{"session_id": id}); res.IsError || out["closed"] != true {
		t.Fatalf("close: %s", text(res))
	}
	res, out := call(t, cs, "close_session", map[string]any{"session_id": id})
	if res.IsError || out["closed"] != false || !strings.Contains(text(res), "closed with close_session") {
		t.Errorf("a second close: %s %v", text(res), out)
	}
}

// TestInstallPreinstalled: install_package of a package the server's
// Python has already (in a version that meets the request) installs
// nothing, needs no installer (this server has none), and says so.
func TestInstallPreinstalled(t *testing.T) {
	py, err := interp.Find(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	dists, err := py.Distributions(context.Background())
	if err != nil || len(dists) == 0 {
		t.Skipf("the interpreter has no packages of its own: %v", err)
	}
	name := ""
	for n := range dists {
		if name == "" || n < name {
			name = n
		}
	}
	cs := connect(t, nil)
	id := newSession(t, cs)
	res, out := call(t, cs, "install_package", map[string]any{"session_id": id, "packages": []any{name + ">=0"}})
	want := name + " " + dists[name]
	if pre, _ := out["preinstalled"].([]any); res.IsError || out["status"] != "installed" || len(pre) != 1 || pre[0] != want || !strings.Contains(text(res), "nothing installed: "+want) {
		t.Errorf("install_package %s: %s %v", name, text(res), out)
	}
	// One the server's Python does not have still needs the installer.
	if res, _ := call(t, cs, "install_package", map[string]any{"session_id": id, "packages": []any{"pysbx-nonexistent"}}); !res.IsError || !strings.Contains(text(res), "installs no packages") {
		t.Errorf("a package to install: %s", text(res))
	}
}
