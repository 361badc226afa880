#!/usr/bin/env bash
# Installs what den needs to build, run and test on a Debian or Ubuntu host:
# Debian packages, and a Go toolchain new enough for go.mod (fetched through
# the Go module proxy when the installed Go is older). Idempotent.
set -euo pipefail

need_go=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$(dirname "$0")/../go.mod")
pkgs=(ca-certificates git util-linux iproute2 bubblewrap python3 python3-venv busybox-static mmdebstrap tmux nftables curl btrfs-progs e2fsprogs runsc qemu-system-x86 linux-image-cloud-amd64 erofs-utils openssh-client openssh-server chromium postgresql)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  missing+=(golang-go)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Prefer an installed Go; let the go command fetch the toolchain go.mod
# asks for (golang.org/toolchain from the module proxy) when it is older.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
export GOTOOLCHAIN="go${need_go}+auto"
go version >&2

# A current gVisor runsc beside Debian's 2022 one (kept, and tested too):
# systrap, checkpoints of sandboxes that had TCP connections, coreutils'
# statx (docs/design.md, "runsc versions"). Built once per pinned version
# from the Go module proxy into /usr/local/bin, ahead of /usr/bin on PATH.
# CGO_ENABLED=0: a cgo build cannot re-execute itself in gVisor's chroot.
runsc_version=v0.0.0-20260905035102-160fafc42237
if ! go version -m /usr/local/bin/runsc 2>/dev/null | grep -q "gvisor.dev/gvisor[[:space:]]*${runsc_version}"; then
  echo "deps: building runsc ${runsc_version} (about 2 minutes)" >&2
  CGO_ENABLED=0 GOBIN=/usr/local/bin go install "gvisor.dev/gvisor/runsc@${runsc_version}"
fi

# Redis for TestRedisKeepsData (a graceful stop keeps its data), unpacked from
# Debian's packages into a cache directory rather than installed, so that no
# redis service starts on the host; the test binds it into its sandbox.
redis_root=/var/cache/den-ci/redis-root
if [ ! -x "$redis_root/usr/bin/redis-server" ]; then
  echo "deps: unpacking redis-server into $redis_root" >&2
  dl=$(mktemp -d)
  chmod 755 "$dl" # apt's download user writes there
  redis_debs=(redis-server redis-tools libjemalloc2 liblzf1)
  (cd "$dl" && apt-get download -qq "${redis_debs[@]}" >/dev/null 2>&1) ||
    { apt-get update -qq && (cd "$dl" && apt-get download -qq "${redis_debs[@]}" >/dev/null); }
  mkdir -p "$redis_root"
  for deb in "$dl"/*.deb; do dpkg -x "$deb" "$redis_root"; done
  rm -rf "$dl"
fi
export DEN_REDIS_ROOT=$redis_root
