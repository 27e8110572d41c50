#!/usr/bin/env bash
# make test-cluster: a real cluster on this machine, then TestCluster
# (cmd/sandbox-gateway/cluster_test.go) against it.
#
#   PostgreSQL (Debian's package, a private cluster)
#   Temporal server built from its Go module, schema by temporal-sql-tool
#   two "hosts" h1, h2: a network namespace each with its own address on
#     the cluster bridge, its own Docker Engine and a sandbox-worker
#     (--advertise-addr <addr>:7443)
#   one sandbox-gateway --no-workers outside both
#   mTLS to Temporal (deploy/cluster/gen-tls.sh), CA-signed forwarders
#
# Everything is torn down on exit, failure or interrupt (trap); logs are
# kept in $CLUSTER_DIR.logs. Needs root, bin/ from `make binaries`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
export CLUSTER_DIR=${CLUSTER_DIR:-/var/tmp/eos-cluster-test}
export CLUSTER_SUBNET=${CLUSTER_SUBNET:-10.213.7}
export CLUSTER_BRIDGE=${CLUSTER_BRIDGE:-eosclbr0}
export BIN=${BIN:-$repo/bin}
export GO=${GO:-go}
# The Temporal binaries, kept between runs: built once per version of
# scripts/cluster/tools (its go.sum and sources name the cache).
TOOLS=${CLUSTER_TOOLS:-/var/tmp/eos-cluster-tools/$(cat "$repo"/scripts/cluster/tools/go.sum "$repo"/scripts/cluster/tools/register-namespace/*.go | sha256sum | cut -c1-12)}
# Fixed ports stay below the kernel's ephemeral range (32768-60999): an outgoing
# connection may hold any port in it, and a listener there fails now and then.
PGPORT=${CLUSTER_PGPORT:-15432}
TPORT=${CLUSTER_TEMPORAL_PORT:-17933}
GWADDR=${CLUSTER_GATEWAY:-127.0.0.1:17878}
export TEMPORAL_ADDRESS=$CLUSTER_SUBNET.1:$TPORT
HOSTS="h1 h2"
host() { bash "$repo/scripts/cluster/host.sh" "$@" 9>&-; }
PGBIN=

exec 9>/var/tmp/eos-cluster-test.lock
flock -n 9 || { echo "test-cluster: another run holds /var/tmp/eos-cluster-test.lock"; exit 1; }
# (every process started below closes fd 9, so the lock ends with this script)

teardown() {
	set +e
	if [ -n "${CLUSTER_KEEP:-}" ] && [ "${1:-}" = exit ]; then
		echo "test-cluster: CLUSTER_KEEP is set: the cluster stays up (gateway $GWADDR, token $CLUSTER_DIR/state-gw/gateway.token); CLUSTER_KEEP= $0 tears it down first"
		return
	fi
	for h in $HOSTS; do host down "$h" >/dev/null 2>&1; done
	for p in gateway temporal; do
		[ -s "$CLUSTER_DIR/$p.pid" ] || continue
		pid=$(cat "$CLUSTER_DIR/$p.pid")
		kill "$pid" 2>/dev/null
		for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
		kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	if [ -s "$CLUSTER_DIR/pg/postmaster.pid" ]; then
		PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
		runuser -u postgres -- "$PGBIN/pg_ctl" -D "$CLUSTER_DIR/pg" -m immediate stop >/dev/null 2>&1
	fi
	ip link del "$CLUSTER_BRIDGE" 2>/dev/null
	for chain in DOCKER-USER FORWARD; do
		while iptables -w -D "$chain" -i "$CLUSTER_BRIDGE" -o "$CLUSTER_BRIDGE" -j ACCEPT 2>/dev/null; do :; done
	done
	if [ -d "$CLUSTER_DIR" ]; then
		rm -rf "$CLUSTER_DIR.logs"; mkdir -p "$CLUSTER_DIR.logs"
		find "$CLUSTER_DIR" -maxdepth 3 -name '*.log' -not -path '*/docker/*' -exec cp {} "$CLUSTER_DIR.logs/" \; 2>/dev/null
		for h in $HOSTS; do for f in worker dockerd; do cp "$CLUSTER_DIR/hosts/$h/$f.log" "$CLUSTER_DIR.logs/$h-$f.log" 2>/dev/null; done; done
		rm -rf "$CLUSTER_DIR"
	fi
}
trap 'teardown exit' EXIT
trap 'exit 130' INT TERM
teardown # what a crashed earlier run left
mkdir -p "$CLUSTER_DIR/work" "$CLUSTER_DIR/logs"
chmod 0755 "$CLUSTER_DIR"

echo "test-cluster: network $CLUSTER_SUBNET.0/24 on $CLUSTER_BRIDGE"
ip link add "$CLUSTER_BRIDGE" type bridge
ip addr add "$CLUSTER_SUBNET.1/24" dev "$CLUSTER_BRIDGE"
ip link set "$CLUSTER_BRIDGE" up
# The hosts reach each other as machines of one LAN do (a sandbox's
# workflow may run on another host's worker, which calls its daemon through
# the host's forwarder). This machine's Docker drops bridged traffic it
# did not set up (FORWARD policy DROP with br_netfilter): let the cluster's
# bridge through, until the teardown.
iptables -w -I DOCKER-USER -i "$CLUSTER_BRIDGE" -o "$CLUSTER_BRIDGE" -j ACCEPT 2>/dev/null ||
	iptables -w -I FORWARD -i "$CLUSTER_BRIDGE" -o "$CLUSTER_BRIDGE" -j ACCEPT

# mTLS everywhere: Temporal's frontend and internode traffic require a
# certificate of the cluster's CA; the hosts' forwarders use CA-signed
# certificates too (pinned by the gateway all the same).
export CLUSTER_TLS=$CLUSTER_DIR/tls
TEMPORAL_NAMES="IP:$CLUSTER_SUBNET.1" HOSTS="h1=$CLUSTER_SUBNET.11 h2=$CLUSTER_SUBNET.12" \
	bash "$repo/deploy/cluster/gen-tls.sh" "$CLUSTER_TLS" >/dev/null
export TEMPORAL_TLS_CA=$CLUSTER_TLS/ca.pem TEMPORAL_TLS_CERT=$CLUSTER_TLS/client.pem TEMPORAL_TLS_KEY=$CLUSTER_TLS/client.key
PGDATA=$CLUSTER_DIR/pg PGPORT=$PGPORT PG_FSYNC=off bash "$repo/deploy/cluster/setup-postgres.sh"
TEMPORAL_BIN=$TOOLS TEMPORAL_CONFIG=$CLUSTER_DIR/temporal TEMPORAL_BIND=$CLUSTER_SUBNET.1 TEMPORAL_PORT=$TPORT PGPORT=$PGPORT \
	TEMPORAL_TLS_DIR=$CLUSTER_TLS bash "$repo/deploy/cluster/setup-temporal.sh"
setsid "$TOOLS/temporal-server" --root / --config "$CLUSTER_DIR/temporal" --env eos --allow-no-auth start \
	>"$CLUSTER_DIR/logs/temporal.log" 2>&1 </dev/null 9>&- &
echo $! >"$CLUSTER_DIR/temporal.pid"
"$TOOLS/register-namespace" -address "$TEMPORAL_ADDRESS" -namespace default

# One deployment secret for the gateway and every host's worker.
for s in gw $HOSTS; do install -d -m 0700 "$CLUSTER_DIR/state-$s"; done
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$CLUSTER_DIR/state-gw/gateway.secret"
chmod 0600 "$CLUSTER_DIR/state-gw/gateway.secret"
for h in $HOSTS; do cp -p "$CLUSTER_DIR/state-gw/gateway.secret" "$CLUSTER_DIR/state-$h/gateway.secret"; done

i=0
for h in $HOSTS; do
	i=$((i + 1))
	echo "test-cluster: host $h ($CLUSTER_SUBNET.$((10 + i)))"
	host up "$h" "$i"
done

setsid "$BIN/sandbox-gateway" --no-workers --listen "$GWADDR" --state-dir "$CLUSTER_DIR/state-gw" \
	--token-file "$CLUSTER_DIR/state-gw/gateway.token" --allow-root "$CLUSTER_DIR/work" --temporal-ui-url http://temporal-ui.test:8233 \
	>"$CLUSTER_DIR/logs/gateway.log" 2>&1 </dev/null 9>&- &
echo $! >"$CLUSTER_DIR/gateway.pid"
for _ in $(seq 240); do grep -q "listening on" "$CLUSTER_DIR/logs/gateway.log" && break; sleep 0.25; done
grep -q "listening on" "$CLUSTER_DIR/logs/gateway.log" || { cat "$CLUSTER_DIR/logs/gateway.log"; exit 1; }

cat >"$CLUSTER_DIR/env" <<ENV
GATEWAY=$GWADDR
TOKEN_FILE=$CLUSTER_DIR/state-gw/gateway.token
WORK=$CLUSTER_DIR/work
HOSTS=$HOSTS
HOST_SCRIPT=$repo/scripts/cluster/host.sh
TEMPORAL=$TEMPORAL_ADDRESS
TLS_CA=$CLUSTER_TLS/ca.pem
TLS_CERT=$CLUSTER_TLS/client.pem
TLS_KEY=$CLUSTER_TLS/client.key
ENV
for h in $HOSTS; do echo "DOCKER_$h=unix://$CLUSTER_DIR/hosts/$h/docker.sock" >>"$CLUSTER_DIR/env"; done
echo "test-cluster: running ${CLUSTER_RUN:-TestCluster}"
cd "$repo"
EOS_CLUSTER_ENV=$CLUSTER_DIR/env $GO test 9>&- -count=1 -timeout 10m -run "${CLUSTER_RUN:-^TestCluster$}" ${CLUSTER_TESTFLAGS:--v} ./cmd/sandbox-gateway/
