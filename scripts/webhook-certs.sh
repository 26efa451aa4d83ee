#!/usr/bin/env bash
# Make a private CA and a serving certificate for cri-resmgr-webhook.
#
#   scripts/webhook-certs.sh OUTDIR [NAMESPACE] [EXTRA_SAN...]
#
# Writes OUTDIR/ca.crt, OUTDIR/ca.key, OUTDIR/tls.crt, OUTDIR/tls.key. The certificate names
# the Service cri-resmgr-webhook in NAMESPACE (default cri-resmgr), as the API server calls
# it; EXTRA_SANs are added as given (e.g. DNS:localhost IP:127.0.0.1). Then:
#   kubectl -n NAMESPACE create secret tls cri-resmgr-webhook-tls --cert=OUTDIR/tls.crt --key=OUTDIR/tls.key
#   and give `base64 -w0 OUTDIR/ca.crt` to the Helm chart as webhook.caBundle (docs/operating.md).
set -euo pipefail
out=${1:?usage: $0 OUTDIR [NAMESPACE] [EXTRA_SAN...]}
ns=${2:-cri-resmgr}
shift $(( $# >= 2 ? 2 : 1 ))
svc=cri-resmgr-webhook
sans="DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local"
for extra in "$@"; do sans="$sans,$extra"; done
mkdir -p "$out"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=cri-resmgr-webhook CA" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=$svc.$ns.svc" -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' "$sans" \
    > "$out/ext.cnf"
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days 365 \
    -extfile "$out/ext.cnf" -out "$out/tls.crt" 2>/dev/null
rm -f "$out/tls.csr" "$out/ext.cnf" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/tls.crt"
echo "$out: ca.crt tls.crt tls.key for $sans"
