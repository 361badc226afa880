#!/usr/bin/env bash
# Lists what den's tests can leave on a host: mounts, network namespaces,
# cgroups, loop devices, network links, nftables tables, tmux sockets and
# processes. `leftovers.sh snap FILE` records the host's state;
# `leftovers.sh check FILE` fails, listing each, on anything that is there
# now and was not then. scripts/test.sh brackets the whole suite with it.
set -euo pipefail

state() {
  awk '{print "mount " $5}' /proc/self/mountinfo
  ls /run/netns 2>/dev/null | sed 's/^/netns /' || true
  # A sandbox's cgroup, inside a parent such as den, den-<hash of the data dir>,
  # den-e2e or den-test
  # (the parents themselves stay, as den serve leaves its own).
  for parent in /sys/fs/cgroup/den* /sys/fs/cgroup/*/den*; do
    [ -d "$parent" ] || continue
    find "$parent" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sed 's/^/cgroup /'
    # A per-daemon parent (den- and 12 hex digits of its data directory's
    # hash) goes when its daemon ends with no box left.
    case "${parent##*/}" in
      den-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]) echo "cgroup-parent $parent" ;;
    esac
  done
  losetup -n -O NAME,BACK-FILE 2>/dev/null | awk '{print "loop " $1 " " $2}' || true
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print "link " $2}'
  nft list tables 2>/dev/null | sed 's/^table /nft /' || true
  find /tmp -maxdepth 2 -path '/tmp/tmux-*' -type s 2>/dev/null | sed 's/^/tmux /'
  ps -eo pid=,comm=,args= | awk '$2 ~ /^(den|runsc|runsc-sandbox|runsc-gofer|exe|qemu-system-x86|sshd|tmux: server|\.test)/ || $3 ~ /\.test$/ {print "proc " $1 " " $2}'
}

case "${1:-}" in
  snap) state | sort -u > "$2" ;;
  check)
    now=$(mktemp)
    state | sort -u > "$now"
    left=$(comm -13 "$2" "$now")
    rm -f "$now"
    if [ -n "$left" ]; then
      echo "leftovers: the tests left these behind:" >&2
      echo "$left" >&2
      exit 1
    fi
    echo "leftovers: none"
    ;;
  *) echo "usage: leftovers.sh snap|check FILE" >&2; exit 2 ;;
esac
