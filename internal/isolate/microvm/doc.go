// Package microvm is den's microVM isolation tier: each box is a QEMU
// `microvm` machine (KVM where it really works, TCG otherwise) booting
// the host's Debian cloud kernel with an initramfs that den builds in Go
// (newc cpio, cached in StateDir keyed by the den binary and the kernel
// release): the den binary itself as /init, its loader and libraries if
// it is dynamic (test binaries), and the virtio-mmio, disk, console, NIC,
// erofs and overlay modules resolved through modules.dep.
//
// The root filesystem comes from the same image layers as on the other
// tiers. Every lower directory becomes a read-only erofs image (mkfs.erofs,
// uncompressed, owners, xattrs and whiteout devices kept; cached in
// StateDir/erofs keyed by the directory's path and a fingerprint of its
// whole tree — names, modes, owners, sizes, device numbers, mtimes and
// ctimes — so an immutable image layer is built once and a host
// directory like /usr is rebuilt when anything in it changes) attached as
// a read-only virtio-blk disk. The writable layers live in one sparse
// ext4 image, spec.Dir/disk.img (8 GiB by default, under a disk quota an
// eighth less than the quota so the guest's ext4 fills before the quota
// does; made with mkfs.ext4 on first start and never mounted on the host:
// its contents are the guest's), holding upper/<name> and work/<name>. The guest init mounts
// the overlays in order; there is no 9p or virtio-fs, so a VM can be
// migrated to a file, and volumes and bind mounts are refused.
//
// The guest configuration (hostname, disks by serial, layers, network)
// travels on the kernel command line (den.cfg=, base64 JSON). The init,
// PID 1 of the VM, loads the modules, mounts the disks and overlays,
// configures eth0 and the hostname, then starts the den agent in a new
// pid and mount namespace whose root is the box's (moved over the
// initramfs and chrooted, as switch_root does), so the box sees only its
// own processes. The agent serves agent.Link on the virtio-serial port
// "den.agent" (a unix socket of QEMU's on the host, RUNDIR/agent.sock); a
// second port, "den.ctl", carries the daemon's line requests to the init:
// sync the guest's filesystems before QEMU is killed, or take a new
// identity after a restore. When the agent ends the init
// reboots, and with panic=-1, reboot=t and -no-reboot any guest death
// (init failure, kernel panic) ends QEMU; the console (RUNDIR/console.log)
// gives the reason.
//
// Networking is the linux tier's too (internal/host): a network namespace
// pinned at RUNDIR/netns gets eth0 from den's host.Network (same slot
// address, bridge, nftables rules and egress proxy). Its addresses and
// routes move to the guest, and a tap device made inside the namespace is
// wired to eth0 with tc (u32 + mirred redirect, both ways; towards eth0
// only the frames from the box's own MAC), so the guest's frames leave
// through the slot's veth with the slot's address, shaped by eth0's qdisc.
//
// Pause and Resume are QMP stop and cont. A checkpoint stops the VM,
// migrates it with exec:cat into dir/memory (QEMU 7.2 has no file: URI),
// and copies the disk image beside it (a reflink or a sparse copy), so
// memory and disk match; Restore starts QEMU with -incoming defer and -S
// on the checkpoint's machine description, feeds it the stream, and
// conts. QEMU runs in its own session and outlives the daemon: Load
// reconnects to its QMP socket and agent port by pid.
//
// A checkpoint can be restored into another box whose files are a copy
// of the source's (a fork that keeps its processes), side by side with
// the source. The guest wakes up as the source: its hostname, eth0's
// addresses and routes, its MAC (in memory and in QEMU's migration
// stream). Its box's tap passes only frames from the box's own MAC
// (guestMAC of its ID), so nothing leaves as the source; before Restore
// returns, the daemon sends the guest init "identity" on den.ctl (the
// spec's hostname, the addresses, routes and MTU of the box's slot, its
// MAC) and waits for its answer. The init sets the hostname, replaces
// eth0's global addresses and default routes, changes the MAC live
// (virtio-net's control queue, so QEMU's receive filter follows), flushes
// its neighbour cache (its next packet re-teaches the gateway its MAC)
// and sends a gratuitous ARP. The fork's open TCP connections break
// (their address is gone); processes, memory and files carry over. The
// identity the guest has is kept in vm.json (for older checkpoints, the
// one on its kernel command line): a restore into the box the checkpoint
// came from, with the same slot, skips the step and keeps its
// connections. Under TCG on a 2-CPU host the step takes 0.1-0.3 s
// without network and 0.3-0.6 s with (cold, translated guest code),
// overlapped with the agent's reconnection.
//
// KVM is probed once (a guest boot that must panic within 10 s) and the
// verdict cached in StateDir/accel.json: under some nested paravirtual
// hypervisors a stock kernel hangs under KVM, and den uses TCG. Under TCG
// the guest is told the host's TSC rate (tsc_early_khz), since its own
// calibration against an emulated PIT can fail and hang the boot.
//
// The guest's wall clock: the machine has a CMOS RTC on the host's UTC
// clock, which the guest kernel reads at boot (RTC_HCTOSYS), so a boot
// starts at the host's time to the second, not at 1970. A guest's clock
// stands still while the VM is stopped (a pause, a checkpoint's save, the
// time between a checkpoint and its restore), so the daemon sends the
// guest init "time <unix ns>" on den.ctl after every boot, restore,
// resume and checkpoint that keeps the box running (box.setClock), and
// every 10 minutes while it runs (box.keepClock: a guest clock drifts
// from the host's, which NTP disciplines); the init steps CLOCK_REALTIME
// to it. A checkpoint records whether its
// machine had an RTC (vm.json "rtc"): one taken by an older den restores
// without, as it was saved.
package microvm
