#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, for pysandbox's tests:
# etcd, containerd, runc and the CNI plugins from Debian; kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy built by
# scripts/k8s/build.sh (pinned, cached). Needs root.
#
#   scripts/k8s/cluster.sh up     start it; prints the kubeconfig's path
#   scripts/k8s/cluster.sh down   stop everything it started and remove its state
#   scripts/k8s/cluster.sh import IMAGE.tar   load an OCI archive into containerd
#
# The node's address is 10.254.254.1 on lo, so nothing depends on the
# machine's network; pods get
# 10.244.0.0/16 on a bridge (not 10.88.0.0/16, podman's own bridge, which
# the podman launcher test installs), services 10.96.0.0/16. No registry is
# reachable, so images are imported (and the pods' pause image is built
# from scripts/k8s/pause).
#
# What this machine needs, learned the hard way (../shared/kubernetes-notes.md):
# containerd's restrict_oom_score_adj (root here lacks CAP_SYS_RESOURCE),
# kubelet's failCgroupV1: false and cgroupfs (cgroup v1, no systemd), and
# the apiserver's --endpoint-reconciler-type=none.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE=${PYSANDBOX_K8S_STATE:-/var/lib/pysandbox-k8s-test}
NODE_IP=10.254.254.1
POD_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
NODE_NAME=pysandbox-node

say() { printf 'cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root"

install_packages() {
	local need=()
	for pkg in etcd-server containerd runc containernetworking-plugins iptables openssl; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
	done
	if [ ${#need[@]} -gt 0 ]; then
		say "installing ${need[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
}

# start NAME CMD...: runs CMD in the background, logging to $STATE/log/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$STATE/log/$name.log" 2>&1 </dev/null &
	echo $! >"$STATE/pid/$name"
}

wait_for() { # what, seconds, command...
	local what=$1 secs=$2
	shift 2
	for _ in $(seq $((secs * 10))); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	die "$what did not come up in ${secs}s; see $STATE/log"
}

certs() {
	local d=$STATE/pki
	mkdir -p "$d"
	[ -f "$d/apiserver.crt" ] && return
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" -days 7 -subj "/CN=pysandbox-test-ca" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -keyout "$d/apiserver.key" -out "$d/apiserver.csr" -subj "/CN=kube-apiserver" 2>/dev/null
	printf 'subjectAltName=IP:%s,IP:127.0.0.1,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' "$NODE_IP" >"$d/san.ext"
	openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -out "$d/apiserver.crt" -days 7 -extfile "$d/san.ext" 2>/dev/null
	openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
	openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
	# One static token, in system:masters, for every component and the tests.
	head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$d/token"
	printf '%s,admin,admin,system:masters\n' "$(cat "$d/token")" >"$d/tokens.csv"
	cat >"$STATE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$d/ca.crt"}
users:
- name: admin
  user: {token: "$(cat "$d/token")"}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
EOF
}

containerd_config() {
	mkdir -p "$STATE/containerd"
	containerd config default >"$STATE/containerd/config.toml.default"
	sed -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
		-e 's/SystemdCgroup = true/SystemdCgroup = false/' \
		-e 's#sandbox_image = ".*"#sandbox_image = "pysandbox.test/pause:1"#' \
		-e 's#bin_dir = ".*"#bin_dir = "/usr/lib/cni"#' \
		-e "s#conf_dir = \".*\"#conf_dir = \"$STATE/cni\"#" \
		-e "s#^root = .*#root = \"$STATE/containerd/root\"#" \
		-e "s#^state = .*#state = \"$STATE/containerd/state\"#" \
		-e "s#address = \"/run/containerd/containerd.sock\"#address = \"$STATE/containerd.sock\"#" \
		"$STATE/containerd/config.toml.default" >"$STATE/containerd/config.toml"
	mkdir -p "$STATE/cni"
	cat >"$STATE/cni/10-pysandbox.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "pysandbox-test", "plugins": [
  {"type": "bridge", "bridge": "pysbxbr0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}
]}
EOF
}

up() {
	install_packages
	local bin
	bin=$(scripts/k8s/build.sh)
	mkdir -p "$STATE/log" "$STATE/pid" "$STATE/etcd" "$STATE/kubelet" "$STATE/pv"
	# The node's address, on lo: some kernels (this VM's) have no dummy
	# interfaces, and no module loading.
	ip addr show dev lo | grep -q " $NODE_IP/" || ip addr add "$NODE_IP/32" dev lo
	sysctl -qw net.ipv4.ip_forward=1
	sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
	certs
	containerd_config
	local t=$SECONDS
	start etcd etcd --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380
	start containerd containerd --config "$STATE/containerd/config.toml"
	wait_for etcd 30 python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:2379/health", timeout=2)'
	local pki=$STATE/pki
	start kube-apiserver "$bin/kube-apiserver" --etcd-servers http://127.0.0.1:2379 --bind-address "$NODE_IP" --advertise-address "$NODE_IP" \
		--secure-port 6443 --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
		--token-auth-file "$pki/tokens.csv" --authorization-mode RBAC --service-cluster-ip-range "$SERVICE_CIDR" \
		--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
		--service-account-signing-key-file "$pki/sa.key" --endpoint-reconciler-type none --allow-privileged=true --kubelet-preferred-address-types InternalIP \
		--enable-admission-plugins NamespaceLifecycle,ServiceAccount,DefaultStorageClass,ResourceQuota,PodSecurity
	wait_for kube-apiserver 60 kubectl --kubeconfig "$STATE/kubeconfig" get --raw /readyz
	start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$STATE/kubeconfig" \
		--service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" --cluster-cidr "$POD_CIDR" \
		--service-cluster-ip-range "$SERVICE_CIDR" --use-service-account-credentials=false --leader-elect=false \
		--controllers '*,-nodeipam' --horizontal-pod-autoscaler-sync-period 5s
	start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$STATE/kubeconfig" --leader-elect=false
	cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$STATE/containerd.sock
# A test node on its own address: the apiserver reads logs without a
# client certificate.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
address: $NODE_IP
podCIDR: $POD_CIDR
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
seccompDefault: false
maxPods: 32
EOF
	start kubelet "$bin/kubelet" --kubeconfig "$STATE/kubeconfig" --config "$STATE/kubelet/config.yaml" --root-dir "$STATE/kubelet/root" \
		--hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
	start kube-proxy "$bin/kube-proxy" --kubeconfig "$STATE/kubeconfig" --cluster-cidr "$POD_CIDR" --proxy-mode iptables --masquerade-all \
		--hostname-override "$NODE_NAME" --bind-address "$NODE_IP" --conntrack-max-per-core 0 --metrics-bind-address 127.0.0.1:10249
	# The pause image the pods' sandboxes use.
	local tmp
	tmp=$(mktemp -d)
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -buildid=" -o "$tmp/pause" ./scripts/k8s/pause
	tar -C "$tmp" --owner=0 --group=0 --numeric-owner -cf "$tmp/rootfs.tar" pause
	python3 scripts/k8s/ociarchive.py "$tmp/rootfs.tar" "$tmp/pause.tar" pysandbox.test/pause:1 /pause >/dev/null
	wait_for containerd 30 ctr --address "$STATE/containerd.sock" version
	import_image "$tmp/pause.tar"
	rm -rf "$tmp"
	wait_for "the node" 60 sh -c "kubectl --kubeconfig '$STATE/kubeconfig' get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
	say "up in $((SECONDS - t))s; node $NODE_NAME Ready"
	echo "$STATE/kubeconfig"
}

import_image() {
	ctr --address "$STATE/containerd.sock" -n k8s.io images import --all-platforms "$1" >&2
}

down() {
	[ -d "$STATE" ] || return 0
	# Best effort from here: whatever is left must go.
	set +e
	if [ -f "$STATE/kubeconfig" ] && [ -f "$STATE/pid/kube-apiserver" ] && kill -0 "$(cat "$STATE/pid/kube-apiserver")" 2>/dev/null; then
		# Pods first, gracefully, so their processes and mounts go.
		timeout 60 kubectl --kubeconfig "$STATE/kubeconfig" delete namespace --all --wait=false >/dev/null 2>&1 || true
		timeout 60 kubectl --kubeconfig "$STATE/kubeconfig" delete pods --all -A --grace-period=5 >/dev/null 2>&1 || true
	fi
	for c in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver; do
		[ -f "$STATE/pid/$c" ] && kill "$(cat "$STATE/pid/$c")" 2>/dev/null || true
	done
	sleep 1
	# Whatever containers are left: killed through containerd, then it goes.
	if [ -S "$STATE/containerd.sock" ]; then
		for task in $(ctr --address "$STATE/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr --address "$STATE/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
		done
		sleep 1
	fi
	for c in containerd etcd; do
		[ -f "$STATE/pid/$c" ] && kill "$(cat "$STATE/pid/$c")" 2>/dev/null || true
	done
	sleep 1
	for c in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
		[ -f "$STATE/pid/$c" ] && kill -9 "$(cat "$STATE/pid/$c")" 2>/dev/null || true
	done
	pkill -9 -f containerd-shim-runc-v2 2>/dev/null || true
	# Mounts under the state directory (pods' volumes, containerd's rootfs).
	grep -o " $STATE[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
	ip link del pysbxbr0 2>/dev/null || true
	# kube-proxy's and the CNI's iptables rules.
	for table in nat filter mangle; do
		iptables-save -t $table 2>/dev/null | grep -oE '^:(KUBE|CNI)-[A-Z0-9-]+' | tr -d : | while read -r chain; do
			iptables -t $table -F "$chain" 2>/dev/null || true
		done
		iptables-save -t $table 2>/dev/null | grep -E '^-A .*(KUBE|CNI)-' | sed 's/^-A/-D/' | while read -r rule; do
			eval "iptables -t $table $rule" 2>/dev/null || true
		done
		iptables-save -t $table 2>/dev/null | grep -oE '^:(KUBE|CNI)-[A-Z0-9-]+' | tr -d : | while read -r chain; do
			iptables -t $table -X "$chain" 2>/dev/null || true
		done
	done
	rm -rf "$STATE"
	say "down: nothing left running"
}

case "${1:-}" in
up) up ;;
down) down ;;
import) import_image "${2:?an OCI archive}" ;;
*) die "usage: scripts/k8s/cluster.sh up|down|import IMAGE.tar" ;;
esac
