#!/usr/bin/env bash
# Temporal's schema on PostgreSQL with Temporal's own SQL tool, and a
# server config for it (no image, no registry). The tool and the server are
# built from Temporal's Go module (scripts/cluster/tools, pinned to the
# version the product is tested with):
#
#   TEMPORAL_BIN=/usr/local/lib/eos TEMPORAL_CONFIG=/etc/eos/temporal \
#   TEMPORAL_BIND=10.0.0.1 [TEMPORAL_TLS_DIR=/etc/eos/tls] deploy/cluster/setup-temporal.sh
#
# With TEMPORAL_TLS_DIR (gen-tls.sh's files) the frontend and internode
# traffic require client certificates of the cluster's CA.
#   $TEMPORAL_BIN/temporal-server --root / --config $TEMPORAL_CONFIG --env eos start
#
# Idempotent: an existing database is upgraded to the newest schema.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
TEMPORAL_BIN=${TEMPORAL_BIN:?set TEMPORAL_BIN to where temporal-server and temporal-sql-tool go}
TEMPORAL_CONFIG=${TEMPORAL_CONFIG:?set TEMPORAL_CONFIG to the server config directory}
TEMPORAL_BIND=${TEMPORAL_BIND:-127.0.0.1}  # the frontend's address, reachable by every host
TEMPORAL_PORT=${TEMPORAL_PORT:-7233}
TEMPORAL_PORT_BASE=${TEMPORAL_PORT_BASE:-$((TEMPORAL_PORT + 1))} # history, matching, worker and membership ports from here
PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-temporal} PGPASSWORD=${PGPASSWORD:-temporal}
GO=${GO:-go}
mkdir -p "$TEMPORAL_BIN" "$TEMPORAL_CONFIG/dynamicconfig"
if [ ! -x "$TEMPORAL_BIN/temporal-server" ] || [ ! -x "$TEMPORAL_BIN/temporal-sql-tool" ] || [ ! -x "$TEMPORAL_BIN/register-namespace" ]; then
	(cd "$repo/scripts/cluster/tools" &&
		$GO build -o "$TEMPORAL_BIN/temporal-server" go.temporal.io/server/cmd/server &&
		$GO build -o "$TEMPORAL_BIN/temporal-sql-tool" go.temporal.io/server/cmd/tools/sql &&
		$GO build -o "$TEMPORAL_BIN/register-namespace" ./register-namespace)
fi
sql() { "$TEMPORAL_BIN/temporal-sql-tool" --plugin postgres12 --ep "$PGHOST" -p "$PGPORT" -u "$PGUSER" --pw "$PGPASSWORD" "$@"; }
for db in temporal temporal_visibility; do
	schema=temporal; [ "$db" = temporal_visibility ] && schema=visibility
	sql --db "$db" create-database >/dev/null 2>&1 || true # exists already
	if ! sql --db "$db" setup-schema -v 0.0 >/dev/null 2>&1; then :; fi # already versioned
	sql --db "$db" update-schema --schema-name "postgresql/v12/$schema" >"$TEMPORAL_CONFIG/schema-$db.log" 2>&1 || { cat "$TEMPORAL_CONFIG/schema-$db.log" >&2; exit 1; }
done
p=$TEMPORAL_PORT_BASE
sed -e "s|@BIND@|$TEMPORAL_BIND|g" -e "s|@FRONTEND@|$TEMPORAL_PORT|g" \
	-e "s|@HISTORY@|$p|g" -e "s|@MATCHING@|$((p + 1))|g" -e "s|@WORKER@|$((p + 2))|g" \
	-e "s|@M_FRONTEND@|$((p + 3))|g" -e "s|@M_HISTORY@|$((p + 4))|g" -e "s|@M_MATCHING@|$((p + 5))|g" -e "s|@M_WORKER@|$((p + 6))|g" \
	-e "s|@HTTP@|$((p + 7))|g" \
	-e "s|@PGADDR@|$PGHOST:$PGPORT|g" -e "s|@PGUSER@|$PGUSER|g" -e "s|@PGPASSWORD@|$PGPASSWORD|g" \
	-e "s|@DYNCONFIG@|$TEMPORAL_CONFIG/dynamicconfig/eos.yaml|g" \
	"$here/temporal.yaml.tmpl" >"$TEMPORAL_CONFIG/eos.yaml"
if [ -n "${TEMPORAL_TLS_DIR:-}" ]; then
	# mTLS on the frontend and between the services, from gen-tls.sh's
	# files: every client must present a certificate of the cluster's CA.
	t=$TEMPORAL_TLS_DIR name=${TEMPORAL_TLS_SERVER_NAME:-$TEMPORAL_BIND}
	side="server: {certFile: $t/temporal-server.pem, keyFile: $t/temporal-server.key, requireClientAuth: true, clientCaFiles: [$t/ca.pem]}"
	client="client: {serverName: \"$name\", rootCaFiles: [$t/ca.pem]}"
	printf '  tls:\n    internode:\n      %s\n      %s\n    frontend:\n      %s\n      %s\n' "$side" "$client" "$side" "$client" >"$TEMPORAL_CONFIG/tls.yaml"
	awk -v f="$TEMPORAL_CONFIG/tls.yaml" '/# @TLS@/ { while ((getline l < f) > 0) print l; next } { print }' "$TEMPORAL_CONFIG/eos.yaml" >"$TEMPORAL_CONFIG/eos.yaml.tmp"
	rm -f "$TEMPORAL_CONFIG/tls.yaml"
	mv "$TEMPORAL_CONFIG/eos.yaml.tmp" "$TEMPORAL_CONFIG/eos.yaml"
fi
chmod 0600 "$TEMPORAL_CONFIG/eos.yaml"
cp "$repo/deploy/temporal/dynamicconfig/eos.yaml" "$TEMPORAL_CONFIG/dynamicconfig/eos.yaml"
echo "temporal: schema ready on $PGHOST:$PGPORT; config $TEMPORAL_CONFIG/eos.yaml (frontend $TEMPORAL_BIND:$TEMPORAL_PORT)"
