#!/usr/bin/env bash
# One namespaced "Docker host" of the test cluster: a network namespace with
# its own address on the cluster bridge, its own Docker Engine (data root,
# exec root with its own containerd, socket, pidfile, cgroup parent) and a
# sandbox-worker serving the forwarder on <address>:7443.
#
#   host.sh up NAME INDEX | start-engine NAME | stop-engine NAME |
#           start-worker NAME | stop-worker NAME | down NAME
#
# Everything lives under $CLUSTER_DIR/hosts/NAME. Needs: CLUSTER_DIR,
# CLUSTER_SUBNET (e.g. 10.213.7), CLUSTER_BRIDGE, BIN (product binaries),
# TEMPORAL_ADDRESS.
set -euo pipefail
cmd=$1 name=$2
d=$CLUSTER_DIR/hosts/$name
ns=eos-$name
sock=$d/docker.sock
addr_of() { cat "$d/addr"; }

wait_for() { # what, tries, command...
	local what=$1 n=$2; shift 2
	for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
	echo "host $name: $what did not come up" >&2; return 1
}

# nsenter --net, not `ip netns exec`: the latter also remounts /sys in a
# new mount namespace, which hides /sys/fs/cgroup from dockerd.
start_engine() {
	mkdir -p "$d/docker" "$d/exec"
	nsenter --net="/var/run/netns/$ns" setsid dockerd --data-root "$d/docker" --exec-root "$d/exec" -H "unix://$sock" \
		--pidfile "$d/docker.pid" --bridge=none --iptables=false --ip6tables=false --ip-forward=false \
		--cgroup-parent "/eos-$name" --containerd-namespace "eos-$name" --containerd-plugins-namespace "eos-$name-plugins" \
		--default-address-pool "base=172.31.0.0/16,size=24" --storage-driver overlay2 \
		>>"$d/dockerd.log" 2>&1 </dev/null &
	wait_for "Docker Engine" 240 docker -H "unix://$sock" version
}

stop_engine() {
	[ -s "$d/docker.pid" ] || return 0
	local pid; pid=$(cat "$d/docker.pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$d/docker.pid"
}

# WORKER_ARGS: more sandbox-worker flags (e.g. --host-only); the
# environment (e.g. EOS_WORKER_FAILPOINT) reaches the worker as it is.
start_worker() {
	local started; started=$(grep -c "worker running" "$d/worker.log" 2>/dev/null || true)
	# shellcheck disable=SC2086 # WORKER_ARGS is a list of flags
	nsenter --net="/var/run/netns/$ns" env DOCKER_HOST="unix://$sock" TEMPORAL_ADDRESS="$TEMPORAL_ADDRESS" HOME="$d/home" \
		setsid "$BIN/sandbox-worker" --host-name "$name" --advertise-addr "$(addr_of):7443" \
		--state-dir "$CLUSTER_DIR/state-$name" --daemon-binary "$BIN/sandbox-daemon" --seccomp-profile "$BIN/seccomp.json" \
		--allow-root "$CLUSTER_DIR/work" ${CLUSTER_TLS:+--hostlink-cert "$CLUSTER_TLS/hostlink-$name.pem" --hostlink-key "$CLUSTER_TLS/hostlink-$name.key"} \
		${WORKER_ARGS:-} >>"$d/worker.log" 2>&1 </dev/null &
	echo $! >"$d/worker.pid"
	# This start's line, not an earlier start's (the log is appended to).
	wait_for "worker" 240 running_since "${started:-0}"
}

# running_since N: the worker log says "worker running" more than N times.
running_since() { test "$(grep -c "worker running" "$d/worker.log")" -gt "$1"; }

stop_worker() {
	[ -s "$d/worker.pid" ] || return 0
	local pid; pid=$(cat "$d/worker.pid")
	kill -"${SIG:-TERM}" "$pid" 2>/dev/null || true
	for _ in $(seq 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$d/worker.pid"
}

case $cmd in
up)
	idx=$3
	mkdir -p "$d/home"
	echo "$CLUSTER_SUBNET.$((10 + idx))" >"$d/addr"
	ip netns add "$ns"
	ip link add "eosv-$name" type veth peer name eth0 netns "$ns"
	ip link set "eosv-$name" master "$CLUSTER_BRIDGE" up
	ip -n "$ns" addr add "$(addr_of)/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
	# The namespace's own Engine and sandboxes live on its own images.
	start_engine
	for img in ${CLUSTER_IMAGES:-eos-test-busybox:1}; do
		docker save "$img" | docker -H "unix://$sock" load -q >/dev/null
	done
	start_worker
	;;
start-engine) start_engine ;;
stop-engine) stop_engine ;;
start-worker) start_worker ;;
stop-worker) stop_worker ;;
down)
	stop_worker || true
	if [ -S "$sock" ]; then
		ids=$(docker -H "unix://$sock" ps -aq 2>/dev/null || true)
		[ -z "$ids" ] || docker -H "unix://$sock" rm -f -v $ids >/dev/null 2>&1 || true
	fi
	stop_engine || true
	ip link del "eosv-$name" 2>/dev/null || true
	ip netns del "$ns" 2>/dev/null || true
	# Leftover mounts of the engine's data root, then the data.
	grep -o " $d/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	rm -rf "$d"
	;;
*) echo "host.sh: unknown command $cmd" >&2; exit 2 ;;
esac
