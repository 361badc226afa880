#!/usr/bin/env bash
# Drives a running den daemon from its OpenAPI document with schemathesis:
# every operation, generated (and mutated) requests, and each answer checked
# to be no 5xx, a status and content type the document lists for the
# operation, and a body matching the document's schema. Fails on any finding.
#
# It builds den, starts `den serve` (linux tier, no networking, dir storage)
# in a temporary directory on a free loopback port, runs schemathesis
# (pinned, in a venv cached under /var/cache/den-ci, outside the checkout)
# for DEN_SCHEMATHESIS_TIME seconds (default 120), then removes every
# sandbox, stops the daemon and deletes everything it made. Needs root and
# python3-venv (scripts/deps.sh installs it); the venv is made on the first
# run (or with `schemathesis.sh --install`) and kept.
set -euo pipefail

version=4.32.5
venv=${DEN_CI_CACHE:-/var/cache/den-ci}/schemathesis
max_time=${DEN_SCHEMATHESIS_TIME:-120}
root=$(cd "$(dirname "$0")/.." && pwd)
export CGO_ENABLED=0 PATH=$PATH:/usr/local/go/bin

if [ "$("$venv/bin/schemathesis" --version 2>/dev/null)" != "schemathesis, version $version" ]; then
  echo "schemathesis: installing schemathesis $version into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$version"
fi
# --install: only the venv (scripts/deps.sh).
[ "${1:-}" = --install ] && exit 0

tmp=$(mktemp -d /tmp/den-schemathesis.XXXXXX)
bin=$tmp/den
(cd "$root" && go build -o "$bin" ./cmd/den)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sock=$tmp/den.sock
daemon=

cleanup() {
  set +e
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    ids=$("$bin" --host "unix://$sock" ls -q 2>/dev/null)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      "$bin" --host "unix://$sock" rm -f $ids >/dev/null
    fi
    kill -TERM "$daemon"
    wait "$daemon" 2>/dev/null
  fi
  # Whatever the daemon mounted under its directories (deepest first).
  awk -v t="$tmp/" 'index($5, t) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m"
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

"$bin" serve --data "$tmp/data" --run "$tmp/run" --listen "tcp://127.0.0.1:$port" --listen "unix://$sock" \
  --net=false --warm 0 --runtimes linux --storage dir >"$tmp/serve.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do
  [ -s "$tmp/data/token" ] && "$bin" --host "unix://$sock" version >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { cat "$tmp/serve.log" >&2; echo "schemathesis: den serve exited" >&2; exit 1; }
  sleep 0.2
done
tok=$(cat "$tmp/data/token")
# The live sandbox of scripts/schemathesis.toml.
export DEN_SCHEMATHESIS_SANDBOX
DEN_SCHEMATHESIS_SANDBOX=$("$bin" --host "unix://$sock" create)

status=0
# From $tmp, and with an in-memory example database, so that nothing is
# written into the checkout. One worker: with two, hypothesis's lambda
# descriptions (ast.parse in threads) hit CPython 3.11's "AST constructor
# recursion depth mismatch" (python/cpython#106905) now and then.
(cd "$tmp" && SCHEMATHESIS_HOOKS="$root/scripts/schemathesis_hooks.py" "$venv/bin/schemathesis" --config-file "$root/scripts/schemathesis.toml" run "$root/api/openapi.json" \
  --url "http://127.0.0.1:$port" -H "Authorization: Bearer $tok" \
  --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
  --phases examples,coverage,fuzzing --generation-database :memory: --max-time "$max_time" -w 1 --no-color) || status=$?
if [ "$status" -ne 0 ]; then
  echo "schemathesis: failed; the daemon's log follows (last 50 lines)" >&2
  tail -n 50 "$tmp/serve.log" >&2
fi
exit "$status"
