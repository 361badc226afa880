package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/den-dev/den/api"
)

// version is den's version, set at build time with
// -ldflags "-X main.version=v1.2.3".
var version = "dev"

var verbVersion = &verb{
	name:     "version",
	summary:  "print the versions of den and of the daemon",
	synopsis: "[flags]",
	details:  "Exits 1 when the daemon cannot be reached (the client's version is printed anyway).",
	example:  "den version --json",
	run:      cmdVersion,
}

type clientVersion struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

func cmdVersion(c *cli, v *verb, args []string) error {
	f := newFlags(v)
	jsonOut := f.jsonFlag("print JSON: {\"client\": ..., \"server\": ..., \"server_error\": ...}")
	pos, _, err := f.parse(args, -1, c.stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef(v, "version takes no arguments")
	}
	cv := clientVersion{Version: version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	cl := c.client(f)
	sv, serr := cl.Version(context.Background())
	if *jsonOut {
		doc := struct {
			Client      clientVersion    `json:"client"`
			Server      *api.VersionInfo `json:"server"`
			Host        string           `json:"host"`
			ServerError string           `json:"server_error,omitempty"`
		}{Client: cv, Server: sv, Host: cl.Addr()}
		if serr != nil {
			doc.ServerError = serr.Error()
		}
		if err := c.printJSON(doc); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "Client:\n  Version:   %s\n  Go:        %s\n  OS/Arch:   %s/%s\n", cv.Version, cv.Go, cv.OS, cv.Arch)
		if sv != nil {
			fmt.Fprintf(c.stdout, "Server: %s\n  Version:   %s\n  Go:        %s\n  Runtimes:  %s\n",
				cl.Addr(), sv.Version, sv.Go, strings.Join(sv.Runtimes, ", "))
			if sv.Cgroup != "" {
				fmt.Fprintf(c.stdout, "  Cgroup:    %s\n", sv.Cgroup)
			}
		}
	}
	return serr
}
