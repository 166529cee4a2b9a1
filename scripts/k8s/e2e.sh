#!/usr/bin/env bash
# pysandbox on a real Kubernetes, end to end: brings up the single-node
# cluster (scripts/k8s/cluster.sh), a real Redis for the replicas' shared
# state, builds and imports the image (scripts/k8s/image.sh), installs
# deploy/kubernetes/overlays/test with two replicas, runs the end-to-end
# tests and the benchmark through real MCP clients — sessions that survive
# a rolling update and a scale-down from 2 to 1 (cmd/pysandbox/handoff_test.go,
# first, ~2 min), then cmd/pysandbox/k8s_test.go — and tears everything
# down, leaving nothing running.
#
# Usage: scripts/k8s/e2e.sh [go test flags...]     (root; ~2 min with the
# Kubernetes binaries cached, plus ~10 min to build them the first time)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "k8s-e2e: run as root" >&2; exit 1; }
say() { printf 'k8s-e2e: %s\n' "$*" >&2; }

start=$SECONDS
STATE=${PYSANDBOX_K8S_STATE:-/var/lib/pysandbox-k8s-test}
export PYSANDBOX_K8S_STATE=$STATE
NS=pysandbox-e2e
redis_pid=""
cleanup() {
	code=$?
	if [ $code -ne 0 ] && [ -f "$STATE/kubeconfig" ]; then
		say "failed; the pods and the control plane said:"
		kubectl --kubeconfig "$STATE/kubeconfig" -n $NS get pods -o wide >&2 || true
		for p in $(kubectl --kubeconfig "$STATE/kubeconfig" -n $NS get pods -o name 2>/dev/null); do
			kubectl --kubeconfig "$STATE/kubeconfig" -n $NS logs "$p" --tail 30 >&2 2>&1 || true
		done
		tail -n 20 "$STATE"/log/kubelet.log >&2 || true
	fi
	[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null
	scripts/k8s/cluster.sh down || true
	say "done in $((SECONDS - start))s"
	exit $code
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v redis-server >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# Leftovers of a run that was killed.
scripts/k8s/cluster.sh down >/dev/null 2>&1 || true
kubeconfig=$(scripts/k8s/cluster.sh up)
export KUBECONFIG=$kubeconfig
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

# The shared store: a real Redis on the node's address, with a password.
redis_pass=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
redis-server --bind 10.254.254.1 --port 6379 --requirepass "$redis_pass" --save "" --appendonly no \
	--dir "$STATE" --loglevel warning --daemonize no >"$STATE/log/redis.log" 2>&1 &
redis_pid=$!
store="redis://:$redis_pass@10.254.254.1:6379/0"

t=$SECONDS
scripts/k8s/image.sh "$STATE/pysandbox.tar" pysandbox:dev >/dev/null
scripts/k8s/cluster.sh import "$STATE/pysandbox.tar"
say "image built and imported in $((SECONDS - t))s"

# Volumes for the replicas' audit chains and paused sessions, on the node (no provisioner
# here), and the secrets.
k apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: pysandbox-test}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
EOF
for i in 0 1 2 3; do
	mkdir -p "$STATE/pv/$i"
	k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: pysandbox-test-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: pysandbox-test
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $STATE/pv/$i, type: Directory}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [pysandbox-node]}]}]
EOF
done
k create namespace $NS >/dev/null
secrets=$(mktemp -d)
printf 'alice %s\nbob %s\n' "alice-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')" "bob-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$secrets/tokens"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secrets/replica-token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secrets/approval-key"
printf '%s' "$store" >"$secrets/store-url"
k -n $NS create secret generic pysandbox-secrets --from-file="$secrets/tokens" --from-file="$secrets/replica-token" \
	--from-file="$secrets/approval-key" --from-file="$secrets/store-url" >/dev/null
k apply -k deploy/kubernetes/overlays/test >/dev/null
t=$SECONDS
k -n $NS rollout status statefulset/pysandbox --timeout=300s >&2
say "2 replicas ready in $((SECONDS - t))s"

PYSANDBOX_K8S_E2E=1 PYSANDBOX_K8S_NAMESPACE=$NS PYSANDBOX_K8S_URL=http://10.96.100.100:8080 PYSANDBOX_K8S_STORE="$store" \
	PYSANDBOX_K8S_TOKENS="$secrets/tokens" PYSANDBOX_K8S_PV="$STATE/pv" \
	go test -count=1 -timeout 20m -run 'TestKubernetes' "$@" ./cmd/pysandbox
rm -rf "$secrets"
