#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each: go test
# -list finds the targets of each package, and each one is fuzzed in its own
# go test invocation (Go fuzzes one target at a time).
#   DEN_FUZZTIME  time per target (default 5s; any -fuzztime value, e.g. 30s or 1000x)
#   DEN_FUZZ      only targets whose name matches this regexp (default: all)
#   DEN_FUZZPKGS  packages to search (default ./...)
# A failing target leaves its crashing input in the package's
# testdata/fuzz/FuzzX/ directory, where go test replays it as a seed from
# then on: commit it with the fix. The script prints one line per target
# and fails if any target failed.
# go.mod asks for Go 1.27.4 or later: earlier fuzz coordinators could fail a
# target with a bare "context deadline exceeded" and no crasher when
# -fuzztime ran out mid-call (go.dev/issue/75804; CI saw it twice on 1.26.8).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
export CGO_ENABLED=${CGO_ENABLED:-0}
fuzztime=${DEN_FUZZTIME:-5s}
only=${DEN_FUZZ:-.}
pkgs=${DEN_FUZZPKGS:-./...}

failed=0
total=0
start=$SECONDS
summary=()
# Packages with a Fuzz function in a test file (go test -list builds each
# package's tests, so skip the rest cheaply first).
for pkg in $(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' $pkgs); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  grep -qs '^func Fuzz' "$dir"/*_test.go || continue
  if ! names=$(go test -list '^Fuzz' "$pkg" 2>&1); then
    echo "fuzz: $pkg: cannot list its fuzz targets:" >&2
    echo "$names" >&2
    failed=$((failed + 1))
    summary+=("FAIL  $pkg (does not build)")
    continue
  fi
  for name in $(echo "$names" | grep '^Fuzz' | grep -E -- "$only"); do
    total=$((total + 1))
    log=$(mktemp)
    t0=$SECONDS
    # -timeout bounds a hung target: fuzztime plus room for building and the seed corpus.
    if go test -count=1 -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" -timeout 10m "$pkg" >"$log" 2>&1; then
      line="ok    $pkg $name ($((SECONDS - t0))s)"
    else
      failed=$((failed + 1))
      line="FAIL  $pkg $name ($((SECONDS - t0))s)"
      tail -n 40 "$log" >&2
      # go test says "Failing input written to testdata/fuzz/FuzzX/HASH".
      crasher=$(sed -n 's/.*Failing input written to \(.*\)$/\1/p' "$log" | tail -n 1)
      if [ -n "$crasher" ]; then
        line="$line: crasher kept as a seed in $dir/$crasher (fix the bug, then commit it)"
      fi
    fi
    echo "$line"
    summary+=("$line")
    rm -f "$log"
  done
done
echo "fuzz: $total targets, $failed failed, ${fuzztime} each, $((SECONDS - start))s in all"
if [ "$failed" -gt 0 ]; then
  printf '%s\n' "${summary[@]}" | grep '^FAIL' >&2
  exit 1
fi
