#!/usr/bin/env bash
# Builds pysandbox's OCI image without a Docker daemon, from this tree:
# a minimal Debian 12 root made by mmdebstrap (python3, pip and CA
# certificates: the Python that sandboxes run) plus the pysandbox binary
# (static, -trimpath), packed as an OCI image layout in a tar archive.
#
# Reproducible: file times are SOURCE_DATE_EPOCH (the last commit's time
# by default), archives are sorted and owner-free, gzip has no name or
# time, and the binary carries no build id, so the same tree and the same
# state of the Debian mirror give the same image digest (printed last).
#
# Usage: scripts/k8s/image.sh OUT.tar [NAME:TAG]   (default pysandbox:dev)
# Import: ctr -n k8s.io images import OUT.tar   (containerd)
#         podman load -i OUT.tar / skopeo copy oci-archive:OUT.tar ...
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:?usage: scripts/k8s/image.sh OUT.tar [NAME:TAG]}
name=${2:-pysandbox:dev}
MIRROR=${PYSANDBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-pip,python3-venv,ca-certificates

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 1700000000)}"
export SOURCE_DATE_EPOCH

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t=$SECONDS
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -buildid=" -o "$tmp/pysandbox" ./cmd/pysandbox
say "go build took $((SECONDS - t))s"

t=$SECONDS
# /usr/local/bin/pysandbox; /var/lib/pysandbox for the audit chain and
# the dependency cache (a volume in the pod); no machine-id, no apt lists.
mmdebstrap --quiet --variant=apt --include="$PACKAGES" --format=tar \
	--customize-hook="copy-in $tmp/pysandbox /usr/local/bin" \
	--customize-hook='mkdir -p "$1/var/lib/pysandbox" "$1/var/cache/pysandbox"' \
	--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/* "$1"/etc/machine-id' \
	bookworm "$tmp/rootfs.tar" "$MIRROR" >&2
say "mmdebstrap took $((SECONDS - t))s"

python3 scripts/k8s/ociarchive.py "$tmp/rootfs.tar" "$out" "$name" /usr/local/bin/pysandbox -- serve --http 0.0.0.0:8080
