#!/usr/bin/env bash
# Installs the client matrix's clients (see ../clients.rs), each from its
# registry: redis-py (latest, pip, into target/client-matrix/py), go-redis
# v9 (the Go module proxy; the script built to target/client-matrix/go-matrix)
# and node-redis (npm, into node/node_modules, as package-lock.json pins).
# redis-cli and redis-benchmark come from Debian's redis-tools (.ci/run).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
out="$root/target/client-matrix"
mkdir -p "$out"

if [ ! -x "$out/py/bin/python" ]; then
    if ! python3 -m venv "$out/py" 2>/dev/null; then
        # Debian's Python keeps venv in its own package.
        sudo=""
        if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
        $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-venv
        rm -rf "$out/py"
        python3 -m venv "$out/py"
    fi
fi
"$out/py/bin/pip" install -q --upgrade redis
echo "clients: redis-py $("$out/py/bin/python" -c 'import redis; print(redis.__version__)')"

(cd "$here/go" && go build -o "$out/go-matrix" .)
echo "clients: $(cd "$here/go" && go list -m github.com/redis/go-redis/v9)"

(cd "$here/node" && npm ci --no-audit --no-fund --silent)
echo "clients: node-redis $(node -p "require('$here/node/node_modules/redis/package.json').version")"
