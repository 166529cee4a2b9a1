package tools

import (
	"strings"
	"testing"
)

// TestNoNetworkHint: a run without network whose code failed reaching a
// host is told in one line how the server allows hosts, besides its
// traceback, in a one-shot run and in a session, and when the failure
// was the cause of the exception that ended it; another error is not,
// nor is a run that has the network (TestNetworkNoHint).
func TestNoNetworkHint(t *testing.T) {
	cs := connect(t, nil)
	_, out := call(t, cs, "create_session", nil)
	session := out["session_id"]
	cases := []struct {
		name, code string
		session    bool
		hint       bool
	}{
		{"urllib", "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=5)", false, true},
		{"socket", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=5)", true, true},
		{"refused", "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=5)", false, true},
		{"chained", "import socket\ntry:\n    socket.getaddrinfo('pypi.org', 443)\nexcept OSError as e:\n    raise RuntimeError('download failed') from e", true, true},
		{"other", "# connection refused\nraise ValueError('no')", false, false},
	}
	for _, c := range cases {
		args := map[string]any{"code": c.code}
		if c.session {
			args["session_id"] = session
		}
		res, out := call(t, cs, "run_python", args)
		msg, _ := out["message"].(string)
		if !res.IsError || strings.Contains(msg, noNetworkHint) != c.hint {
			t.Errorf("%s: message %q (hint wanted: %v)", c.name, msg, c.hint)
		}
		if c.hint && !strings.Contains(text(res), noNetworkHint+"\n") {
			t.Errorf("%s: the text does not give the hint on a line:\n%s", c.name, text(res))
		}
		if e, _ := out["error"].(map[string]any); e == nil || e["traceback"] == "" {
			t.Errorf("%s: no traceback: %v", c.name, out["error"])
		}
	}
}

// TestNetworkNoHint: a run that has the network is not told it has none.
func TestNetworkNoHint(t *testing.T) {
	cs := newNetServer(t).connect(nil, nil)
	res, out := call(t, cs, "run_python", map[string]any{"code": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=5)"})
	if msg, _ := out["message"].(string); !res.IsError || strings.Contains(msg, "no network") {
		t.Errorf("message %q", msg)
	}
}
