#!/usr/bin/env bash
# Install Portkey's open-source Node gateway as a benchmark peer:
#     loadtests/peers/install_portkey.sh [DIR]      (default: .peers/portkey)
# then: python -m loadtests.overhead --portkey DIR ...
#
# Version 1.15.2 from npm. Its streaming path fails on Node 20 with "TypeError: immutable" when it
# adds its x-portkey-* headers to a response whose headers are read-only (Portkey-AI/gateway issues
# 1389 and 1550; fixes proposed upstream in pull requests 1390 and 1551). The one edit below skips
# those headers when they cannot be added and changes nothing else (where the headers are writable,
# as for non-streaming answers, they are added as before).
set -euo pipefail
DIR=${1:-.peers/portkey}
mkdir -p "$DIR"
cd "$DIR"
cat > package.json <<'JSON'
{
  "name": "portkey-peer",
  "private": true,
  "dependencies": { "@portkey-ai/gateway": "1.15.2" },
  "overrides": { "@hono/node-server": "1.14.2" }
}
JSON
npm install --no-audit --no-fund --loglevel=error
SERVER=node_modules/@portkey-ai/gateway/build/start-server.js
if ! grep -q updateHeadersUnsafe "$SERVER"; then
  sed -i 's/updateHeaders(e,t,a){return e.headers.append/updateHeaders(e,t,a){try{return this.updateHeadersUnsafe(e,t,a)}catch(x){return e}}updateHeadersUnsafe(e,t,a){return e.headers.append/' "$SERVER"
  grep -q updateHeadersUnsafe "$SERVER" || { echo "patch did not apply to $SERVER" >&2; exit 1; }
fi
echo "Portkey gateway ready: node $DIR/$SERVER --port=8787 --headless"
