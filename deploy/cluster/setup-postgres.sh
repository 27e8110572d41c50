#!/usr/bin/env bash
# A private PostgreSQL cluster for Temporal, from Debian's packages (no
# image, no registry): initdb as the postgres user in PGDATA, listening on
# PGHOST:PGPORT only, one role (PGUSER/PGPASSWORD) owning Temporal's two
# databases. Idempotent: an existing PGDATA is started as it is.
#
#   PGDATA=/var/lib/eos/pg PGPORT=5432 deploy/cluster/setup-postgres.sh
set -euo pipefail
PGDATA=${PGDATA:?set PGDATA to the cluster data directory}
PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-temporal}
PGPASSWORD=${PGPASSWORD:-temporal}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	install -d -o postgres -g postgres -m 0700 "$PGDATA"
	pw=$(mktemp); chmod 0600 "$pw"; chown postgres "$pw"; printf '%s\n' "$PGPASSWORD" >"$pw"
	runuser -u postgres -- "$BIN/initdb" -D "$PGDATA" -U "$PGUSER" --pwfile="$pw" \
		--auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 >/dev/null
	rm -f "$pw"
fi
if ! runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
	runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -w -t 60 -l "$PGDATA/server.log" \
		-o "-c listen_addresses=$PGHOST -c port=$PGPORT -c unix_socket_directories=$PGDATA -c max_connections=200 -c fsync=${PG_FSYNC:-on}" start >/dev/null
fi
echo "postgresql: $PGHOST:$PGPORT (data $PGDATA, role $PGUSER)"
