#!/usr/bin/env bash
# Builds the Kubernetes components a single-node test cluster needs
# (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy, kubectl) from the Go module proxy, pinned, into a cache keyed
# by version, and prints the directory holding them. Nothing else is
# downloaded: etcd, containerd, runc and the CNI plugins come from Debian
# (scripts/k8s/cluster.sh installs them).
#
#   ${PYSANDBOX_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pysandbox-k8s}/v$VERSION/bin
#
# Cold: about 20 minutes on 2 cores (kube-apiserver alone is most of it);
# with the binaries cached: nothing to do.
set -euo pipefail

K8S_VERSION=1.37.2
STAGING_VERSION=0.37.2
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

say() { printf 'k8s-build: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

command -v go >/dev/null || die "Go is required"
cache="${PYSANDBOX_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/pysandbox-k8s}/v$K8S_VERSION"
bin="$cache/bin"
mkdir -p "$bin"
(
	flock 9
	missing=()
	for c in "${COMPONENTS[@]}"; do
		[ -x "$bin/$c" ] || missing+=("$c")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		exit 0
	fi
	src="$cache/src"
	mkdir -p "$src"
	cd "$src"
	if [ ! -f go.mod ] || ! grep -q "k8s.io/kubernetes v$K8S_VERSION" go.mod; then
		say "resolving k8s.io/kubernetes v$K8S_VERSION and its staging modules"
		t=$SECONDS
		rm -f go.mod go.sum
		go mod init pysandbox-k8s-build >/dev/null 2>&1
		gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
		[ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes v$K8S_VERSION"
		# Kubernetes' own go.mod points its staging modules at directories
		# of its tree; a module that uses it points them at their releases.
		# (The sample-* modules are not released and not needed.)
		{
			echo "require k8s.io/kubernetes v$K8S_VERSION"
			grep -oE '^\s*k8s.io/[a-z0-9-]+ => \./staging/src/k8s.io/[a-z0-9-]+' "$gomod" | awk '{print $1}' | grep -v 'k8s.io/sample-' |
				sort -u | sed "s|.*|replace & => & v$STAGING_VERSION|"
		} >>go.mod
		cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
		go mod tidy >&2
		say "go mod tidy took $((SECONDS - t))s"
	fi
	ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#1.}"
	ldflags="${ldflags%.*}"
	ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitTreeState=clean"
	for c in "${missing[@]}"; do
		say "building $c (cold: kube-apiserver takes the longest)"
		t=$SECONDS
		CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c" >&2
		mv "$bin/$c.tmp" "$bin/$c"
		say "$c took $((SECONDS - t))s"
	done
) 9>"$cache/.lock"
printf '%s\n' "$bin"
