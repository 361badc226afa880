package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/host"
	"github.com/den-dev/den/internal/isolate"
	"github.com/den-dev/den/internal/isolate/gvisor"
	"github.com/den-dev/den/internal/isolate/linux"
	"github.com/den-dev/den/internal/isolate/microvm"
)

// tierSet is what den serve found about the isolation tiers.
type tierSet struct {
	runtimes    map[string]isolate.Runtime
	unavailable map[string]string
	info        []api.RuntimeInfo
}

// setupTiers builds the gvisor and microvm runtimes next to linux (rt)
// where this host can run them (and enabled names them), and records for
// every tier whether it runs here, how, and if not, why. runsc and
// platform are the gvisor tier's ("" for runsc on PATH, and the fastest
// platform that works); cgParent is the daemon's cgroup parent.
func setupTiers(log *slog.Logger, rt *linux.Runtime, runDir, data, cgParent string, nw *host.Network, enabled []string, runsc, platform string) tierSet {
	ts := tierSet{runtimes: map[string]isolate.Runtime{"linux": rt}, unavailable: map[string]string{}}
	on := func(name string) bool { return slices.Contains(enabled, name) }
	ts.info = append(ts.info, api.RuntimeInfo{Name: "linux", Available: true,
		Details: map[string]string{"isolation": "namespaces, seccomp, cgroup " + rt.CgroupVersion()}})

	gi := api.RuntimeInfo{Name: "gvisor"}
	if !on("gvisor") {
		gi.Reason = "turned off (den serve --runtimes)"
	} else if g, err := gvisor.New(gvisor.Config{RunDir: filepath.Join(runDir, "gvisor"), CgroupParent: cgParent, Runsc: runsc, Platform: platform, Network: nw}); err != nil {
		gi.Reason = strings.TrimPrefix(err.Error(), "gvisor: ")
	} else {
		ts.runtimes["gvisor"] = g
		in := g.Info()
		gi.Available = true
		gi.Details = map[string]string{"runsc": in.Version, "runsc_path": in.Runsc, "platform": in.Platform, "platform_reason": in.PlatformReason}
	}
	ts.info = append(ts.info, gi)

	mi := api.RuntimeInfo{Name: "microvm"}
	if !on("microvm") {
		mi.Reason = "turned off (den serve --runtimes)"
	} else if m, err := microvm.New(microvm.Config{RunDir: filepath.Join(runDir, "microvm"), StateDir: filepath.Join(data, "microvm"), CgroupParent: cgParent, Network: nw}); err != nil {
		mi.Reason = strings.TrimPrefix(err.Error(), "the microvm tier is unavailable: ")
	} else {
		ts.runtimes["microvm"] = m
		in := m.Info()
		mi.Available = true
		mi.Details = map[string]string{"qemu": in.QEMUVersion, "kernel": in.Kernel, "accel": in.Accel, "accel_reason": in.AccelReason}
	}
	ts.info = append(ts.info, mi)

	for _, i := range ts.info {
		if !i.Available {
			ts.unavailable[i.Name] = i.Reason
			log.Info("runtime unavailable", "runtime", i.Name, "why", i.Reason)
		} else {
			log.Info("runtime available", "runtime", i.Name, "details", fmt.Sprint(i.Details))
		}
	}
	return ts
}

// defaultTier picks the daemon's default runtime.
func (ts tierSet) defaultTier(name string) (isolate.Runtime, error) {
	rt, ok := ts.runtimes[name]
	if !ok {
		if why, known := ts.unavailable[name]; known {
			return nil, fmt.Errorf("--runtime %s: not available on this host: %s", name, why)
		}
		return nil, &usageError{verb: "serve", msg: fmt.Sprintf("--runtime %q: use linux, gvisor or microvm", name)}
	}
	for i := range ts.info {
		ts.info[i].Default = ts.info[i].Name == name
	}
	return rt, nil
}
