#!/usr/bin/env bash
# Installs what the test suite needs on Debian/Ubuntu, then runs it: Go
# hygiene (scripts/hygiene.sh: gofmt, go mod tidy, go vet, staticcheck,
# go test -race), go test, the official MCP conformance suite (scripts/conformance.sh), and
# pysandbox on a real Kubernetes (scripts/k8s/e2e.sh).
# Usage: scripts/test.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use:
#   python3     the default interpreter every sandbox runs
#   bubblewrap  the bwrap backend's tests
#   passwd      useradd/userdel, for the unprivileged-user test
#   python3-pandas  the warm pool's preloading tests
#   python3-matplotlib  figures returned as images
#   python3-pil the rich outputs of real images (display(), _repr_png_)
#   python3-requests  a real HTTP client inside the sandbox, through the network proxy
#   python3-pip the installer that builds dependency environments (internal/deps)
#   redis-server  the shared store of several replicas (internal/sharedstate), started by the tests
#   chromium    the real browser that drives the operator console (cmd/pysandbox/browser_test.go)
#   podman      the container runtime serve --container runs the image under (cmd/pysandbox/container_test.go)
need=()
for pkg in python3 bubblewrap passwd python3-pandas python3-matplotlib python3-pil python3-pip python3-requests redis-server chromium podman; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "installing: ${need[*]}"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	echo "Go 1.26 or newer is required: https://go.dev/dl/" >&2
	exit 1
fi
go mod download
# The MCP reference servers the upstream-tool tests call (pinned, from npm,
# into ~/.cache; installs npm with apt-get when it is missing).
scripts/refservers.sh >/dev/null
# gofmt, go mod tidy, go vet, staticcheck and the race detector.
scripts/hygiene.sh
go test -count=1 -timeout 20m "$@" ./...

# The official MCP conformance suite against `serve --http` (it installs
# npm and a pinned Node 22 + suite into ~/.cache on first use).
scripts/conformance.sh

# Several replicas on a real single-node Kubernetes (builds the Kubernetes
# components into ~/.cache on first use: about 10 minutes), end to end.
# A cluster needs root.
if [ "$(id -u)" -eq 0 ]; then
	exec scripts/k8s/e2e.sh "$@"
fi
echo "skipping the Kubernetes end-to-end test: it brings up a cluster, which needs root (sudo scripts/k8s/e2e.sh)"
