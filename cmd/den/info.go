package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"golang.org/x/crypto/ssh"
)

var verbInfo = &verb{
	name:     "info",
	summary:  "show which isolation tiers this host runs (and why not), storage and network",
	synopsis: "[flags]",
	details: `For each tier (linux: namespaces; gvisor: a second kernel, runsc;
microvm: a virtual machine, QEMU) says whether the daemon's host can run it,
how (gVisor's platform, the microVM's accelerator kvm or tcg and its guest
kernel) and, for a missing one, why and what to install; and the SSH
gateway's address and host key fingerprint when it runs (den serve --ssh).`,
	example: "den info\nden info --json | jq '.runtimes[] | select(.available)'",
	run:     cmdInfo,
}

func cmdInfo(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print the daemon's answer as JSON")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "info takes no arguments")
	}
	info, err := c.client(f).Info(context.Background())
	if err != nil {
		return err
	}
	if *jsonOut {
		return c.printJSON(info)
	}
	fmt.Fprintf(c.stdout, "den %s", info.Version)
	if info.Storage != "" {
		fmt.Fprintf(c.stdout, ", storage %s", info.Storage)
		if info.StorageSize > 0 {
			disk := "unlimited"
			if info.Storage == "dir" {
				disk = "none (no quotas)"
			} else if info.DefaultDisk > 0 {
				disk = humanSize(int64(info.DefaultDisk))
			}
			fmt.Fprintf(c.stdout, " (%s, reserve %s, default disk %s)", humanSize(int64(info.StorageSize)), humanSize(int64(info.StorageReserve)), disk)
		}
	}
	if info.Cgroup != "" {
		fmt.Fprintf(c.stdout, ", cgroup %s", info.Cgroup)
	}
	net := "off (loopback only)"
	if info.Network {
		net = "on"
	}
	fmt.Fprintf(c.stdout, ", sandbox network %s\n", net)
	if gw := info.SSH; gw != nil {
		fp := gw.HostKey
		if key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(gw.HostKey)); err == nil {
			fp = ssh.FingerprintSHA256(key)
		}
		fmt.Fprintf(c.stdout, "ssh gateway %s, host key %s (den ssh pins it)\n", gw.Addr, fp)
	}
	fmt.Fprintln(c.stdout)
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUNTIME\tAVAILABLE\tDETAILS")
	for _, r := range info.Runtimes {
		avail := "no"
		if r.Available {
			avail = "yes"
			if r.Default {
				avail = "yes (default)"
			}
		}
		var det []string
		keys := make([]string, 0, len(r.Details))
		for k := range r.Details {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			det = append(det, k+"="+r.Details[k])
		}
		if r.Reason != "" {
			det = append(det, r.Reason)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Name, avail, strings.Join(det, "; "))
	}
	return tw.Flush()
}
