// Package host is the Linux kernel plumbing den's isolation tiers share:
// the sandbox network (one bridge, a veth and address per slot, the
// nftables rules that send every connection to den's egress proxy,
// bandwidth shaping, UDP allowances), network namespaces pinned in the
// file system, views of the boxes' cgroups, /proc/PID/stat, and mount
// helpers (private mounts, directories made inside a root without leaving
// it, a box's /proc, /sys and /dev with the kernel interfaces masked).
//
// It knows nothing of boxes or tiers: the linux, gvisor and microvm
// tiers (internal/isolate/...) each import it, and no tier imports
// another (internal/isolate's TestTiersIndependent checks that).
package host
