#!/usr/bin/env bash
# Go hygiene, as CI checks it (scripts/test.sh runs this first): gofmt,
# go mod tidy, go vet, staticcheck (pinned, from the Go module proxy), and
# the race detector on the packages whose concurrency is their point; and
# the cross-compiled builds for macOS and Windows, where pysandbox is the
# launcher of the Linux server in a container (internal/launcher).
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2 # honnef.co/go/tools; Go 1.26

unformatted=$(gofmt -l cmd internal deploy scripts 2>/dev/null || true)
if [ -n "$unformatted" ]; then
	echo "gofmt: these files are not formatted (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi
if ! go mod tidy -diff; then
	echo "go.mod/go.sum are not tidy (run go mod tidy)" >&2
	exit 1
fi
go vet ./...
for t in darwin/arm64 darwin/amd64 windows/amd64; do
	GOOS=${t%/*} GOARCH=${t#*/} CGO_ENABLED=0 go build -o /dev/null ./cmd/pysandbox || { echo "cross build for $t failed" >&2; exit 1; }
	GOOS=${t%/*} GOARCH=${t#*/} go vet ./internal/launcher ./deploy/kubernetes/seccomp
done
bin="$(go env GOPATH)/bin"
if ! "$bin/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
	GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
"$bin/staticcheck" ./...
go test -race -count=1 -timeout 20m \
	./internal/activity/ ./internal/audit/ ./internal/cluster/ ./internal/console/ ./internal/egress/ \
	./internal/govern/ ./internal/confdoc/ ./internal/httpserver/ ./internal/metrics/ ./internal/policy/ ./internal/quota/ ./internal/sharedstate/ \
	./internal/upstream/ ./internal/tools/ ./internal/worker/ ./internal/launcher/ ./internal/pydist/ ./internal/snapshot/
echo "hygiene: gofmt, go mod tidy, go vet, staticcheck $STATICCHECK_VERSION, the race detector and the macOS/Windows builds are clean"
