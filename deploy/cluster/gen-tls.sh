#!/usr/bin/env bash
# mTLS material for a cluster, from one private CA (openssl, no service):
#   ca.pem/ca.key             the cluster CA (keep ca.key offline)
#   temporal-server.pem/.key  the Temporal frontend and internode (SANs: $TEMPORAL_NAMES)
#   client.pem/.key           every product process's Temporal client cert
#   hostlink-<host>.pem/.key  each host's forwarder (SAN: its advertised address)
#
#   TEMPORAL_NAMES="DNS:temporal.internal,IP:10.0.0.1" HOSTS="h1=10.0.0.11 h2=10.0.0.12" \
#   deploy/cluster/gen-tls.sh /etc/eos/tls
#
# Idempotent: existing files are kept. Everything is 0600 in a 0700 dir.
set -euo pipefail
out=${1:?usage: gen-tls.sh DIR}
TEMPORAL_NAMES=${TEMPORAL_NAMES:-DNS:localhost,IP:127.0.0.1}
DAYS=${DAYS:-825}
umask 077
mkdir -p "$out"
cd "$out"
if [ ! -s ca.pem ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$DAYS" \
		-subj "/CN=eos-cluster-ca" -keyout ca.key -out ca.pem 2>/dev/null
fi
cert() { # name cn san usage
	[ -s "$1.pem" ] && return 0
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
	openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$DAYS" \
		-extfile <(printf "subjectAltName=%s\nextendedKeyUsage=%s\n" "$3" "$4") -out "$1.pem" 2>/dev/null
	rm -f "$1.csr"
}
cert temporal-server eos-temporal "$TEMPORAL_NAMES" serverAuth,clientAuth
cert client eos-client "DNS:eos-client" clientAuth
for h in ${HOSTS:-}; do
	name=${h%%=*} addr=${h#*=}
	san="DNS:$name"; [[ $addr =~ ^[0-9.]+$ ]] && san="$san,IP:$addr" || san="$san,DNS:$addr"
	cert "hostlink-$name" "eos-hostlink-$name" "$san" serverAuth
done
ls -1 "$out"
