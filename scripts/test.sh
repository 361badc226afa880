#!/usr/bin/env bash
# den's test command: the README gives it and CI (.ci/run) runs exactly it.
# Run it as root from any shell (no sudo needed): it installs what the tests
# need (scripts/deps.sh), builds den, vets, checks formatting and runs every
# package's tests with CGO_ENABLED=0, so the test binaries are static on a
# host with or without gcc (the gvisor tier runs the test binary as its
# agent inside an empty root, where a dynamically linked one cannot load).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "test.sh: run as root (sudo ./scripts/test.sh): den's isolation tests need namespaces, cgroups and mounts" >&2
  exit 1
fi
source scripts/deps.sh
export PATH=$PATH:/usr/local/go/bin:$(go env GOPATH)/bin
export CGO_ENABLED=0
# Every tier is required: scripts/deps.sh installed what each needs, so a
# tier den cannot start fails its tests instead of skipping them
# (internal/testenv).
export DEN_REQUIRE_TIERS=${DEN_REQUIRE_TIERS-linux,gvisor,microvm}
go build -o bin/den ./cmd/den
# go.mod and go.sum say exactly what the code imports (nothing to tidy).
go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy and commit the result"; exit 1; }
go vet ./...
test -z "$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
# What the host holds before the tests: afterwards, anything new (a mount,
# netns, cgroup, loop device, link, nftables table, tmux socket, process)
# is something a test left behind, and fails the run.
before=$(mktemp)
trap 'rm -f "$before"' EXIT
scripts/leftovers.sh snap "$before"
go test -count=1 -timeout 30m ./...
# The gvisor tier with Debian's 2022 runsc too (the tests above use the
# current one scripts/deps.sh puts in /usr/local/bin).
DEN_RUNSC=/usr/bin/runsc go test -count=1 -timeout 5m ./internal/isolate/gvisor/
# schemathesis drives a real daemon from api/openapi.json: no 5xx, every
# status documented, every answer matching its schema.
DEN_SCHEMATHESIS_TIME=${DEN_SCHEMATHESIS_TIME:-120} scripts/schemathesis.sh
# Every fuzz target for a few seconds each on top of the seed replay above
# (a crasher stays in the package's testdata/fuzz as a seed).
DEN_FUZZTIME=${DEN_FUZZTIME:-5s} scripts/fuzz.sh
scripts/leftovers.sh check "$before"
