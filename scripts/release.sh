#!/usr/bin/env bash
# Builds pysandbox's release: static binaries (no cgo) for linux/amd64 and
# linux/arm64, and for darwin/arm64, darwin/amd64 and windows/amd64 (where
# `serve` runs the Linux server in the OCI image under Podman or Docker:
# internal/launcher), with version information (`pysandbox version` shows the
# version, commit and build date), their SHA-256 checksums, and a
# CycloneDX SBOM per binary (cyclonedx-gomod, pinned, from the Go module
# proxy) that names VERSION as the binary's version. Everything lands in dist/ (or $DIST).
# Usage: scripts/release.sh [VERSION]   (default: git describe, else 0.1.0-dev)
#        RELEASE_TARGETS="linux/amd64" scripts/release.sh   (fewer targets)
#        RELEASE_IMAGE=1 scripts/release.sh   (also the OCI image archive,
#          pysandbox-VERSION-image.tar, tagged pysandbox:VERSION, which the
#          macOS and Windows binaries load when it lies beside them; built by
#          scripts/k8s/image.sh: mmdebstrap and the Debian mirror, minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

CYCLONEDX_VERSION=v1.10.0 # github.com/CycloneDX/cyclonedx-gomod
targets=${RELEASE_TARGETS:-"linux/amd64 linux/arm64 darwin/arm64 darwin/amd64 windows/amd64"}
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
	commit="$commit+dirty"
fi
version=${1:-$(git describe --tags --always 2>/dev/null || echo 0.1.0-dev)}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
pkg=github.com/pysandbox/pysandbox/internal/cli
# main.* are the macOS and Windows builds' (cmd/pysandbox/main_other.go);
# the linker ignores them on Linux, and internal/cli's elsewhere.
ldflags="-s -w -X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.buildDate=$date -X main.version=$version -X main.commit=$commit -X main.buildDate=$date"

dist=${DIST:-dist}
rm -rf "$dist"
mkdir -p "$dist"
bin="$(go env GOPATH)/bin"
if ! "$bin/cyclonedx-gomod" version 2>/dev/null | grep -q "${CYCLONEDX_VERSION#v}"; then
	GOFLAGS= go install "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$CYCLONEDX_VERSION"
fi
for t in $targets; do
	os=${t%/*} arch=${t#*/}
	out="$dist/pysandbox-$version-$os-$arch"
	[ "$os" = windows ] && out="$out.exe"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out" ./cmd/pysandbox
	# The SBOM of the binary itself (its embedded module list), with
	# VERSION as the main component's version: `app` would take the
	# version from git, a pseudo-version unless HEAD is tagged.
	"$bin/cyclonedx-gomod" bin -licenses=false -json -version "$version" -output "$out.cdx.json" "$out" 2>/dev/null
	echo "built $out"
done
if [ "${RELEASE_IMAGE:-}" = 1 ]; then
	scripts/k8s/image.sh "$dist/pysandbox-$version-image.tar" "pysandbox:$version" >/dev/null
	echo "built $dist/pysandbox-$version-image.tar"
fi
(cd "$dist" && sha256sum pysandbox-* > SHA256SUMS)
echo "$dist/SHA256SUMS:"
cat "$dist/SHA256SUMS"
