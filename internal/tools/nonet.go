package tools

import (
	"strings"

	"github.com/pysandbox/pysandbox/internal/engine"
	"github.com/pysandbox/pysandbox/internal/worker"
)

// noNetworkHint is what a run without network that failed reaching one
// is told, besides its traceback.
const noNetworkHint = "This sandbox has no network: the server allows hosts with --allow-net HOST or a policy's network section (check_environment lists them)."

// networkFailures are, lowercased, what the exceptions of a connection
// that cannot be made say (socket, urllib, http.client, requests, httpx,
// aiohttp): no name resolution, no route, nobody listening.
var networkFailures = []string{
	"name or service not known",
	"temporary failure in name resolution",
	"no address associated with hostname",
	"failed to resolve",
	"network is unreachable",
	"connection refused",
}

// hintNoNetwork adds noNetworkHint to the message of a run that had no
// network and ended with an exception from a network call.
func (s *server) hintNoNetwork(res *engine.Result) {
	if res == nil || s.networkOn() || !networkFailure(res.Error) {
		return
	}
	if res.Message == "" {
		res.Message = noNetworkHint
	} else if !strings.Contains(res.Message, noNetworkHint) {
		res.Message += "; " + noNetworkHint
	}
}

// networkFailure reports whether e is, or was raised while handling, a
// failed network call: its message, or an exception line of its
// traceback (not indented, unlike the frames and their source) says so.
func networkFailure(e *worker.Exception) bool {
	if e == nil {
		return false
	}
	if strings.HasSuffix(e.Type, "gaierror") || saysNoNetwork(e.Message) {
		return true
	}
	for line := range strings.Lines(e.Traceback) {
		if line != "" && line[0] != ' ' && saysNoNetwork(line) {
			return true
		}
	}
	return false
}

func saysNoNetwork(text string) bool {
	text = strings.ToLower(text)
	for _, f := range networkFailures {
		if strings.Contains(text, f) {
			return true
		}
	}
	return false
}
