// Package api holds den's wire types: the JSON documents of the HTTP API, the
// error document and its kinds, and the framed byte stream used for command
// output. It depends on the standard library only, so the SDK, the daemon and
// the in-sandbox agent can all share it without pulling in each other.
package api

import (
	"encoding/json"
	"time"
)

// Version is the API version prefix of every path.
const Version = "v1"

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateRemoving = "removing"
	// StatePaused: every process frozen, memory kept; any use resumes it.
	StatePaused = "paused"
	// StateHibernated: memory freed, files kept; any use resumes it.
	StateHibernated = "hibernated"
	// StateFailed: the sandbox's box ended on its own (its runtime crashed
	// or was killed, a guest kernel panicked); Error says why. Its files
	// are kept: start it again, or remove it.
	StateFailed = "failed"
)

// States lists every state a sandbox can be in, in lifecycle order.
var States = []string{StateCreating, StateRunning, StatePaused, StateHibernated, StateStopped, StateFailed, StateRemoving}

// Sandbox is the record of one sandbox.
type Sandbox struct {
	ID      string `json:"id"`
	Name    string `json:"name,omitempty"`
	Image   string `json:"image"`
	Runtime string `json:"runtime"`
	State   string `json:"state"`
	// Error is why the sandbox failed (state "failed").
	Error    string            `json:"error,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Env      []string          `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	User     string            `json:"user,omitempty"`
	Hostname string            `json:"hostname"`
	Limits   Limits            `json:"limits"`
	TTL      Duration          `json:"ttl,omitempty"`
	// IdleTimeout stops the sandbox after this long without exec, file or
	// process activity through the API (files and processes stay; start
	// it again with den start).
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// IdleAction is what the idle timeout does: stop (the default), pause
	// or hibernate.
	IdleAction string        `json:"idle_action,omitempty"`
	Network    NetworkPolicy `json:"network"`
	// ShmSize is the size of the sandbox's /dev/shm (0: 64 MiB).
	ShmSize Size `json:"shm_size,omitempty"`
	// StopSignal and StopTimeout: see CreateRequest.
	StopSignal  string    `json:"stop_signal,omitempty"`
	StopTimeout *Duration `json:"stop_timeout,omitempty"`
	// Volumes and Mounts are attached at every start.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	Mounts  []BindMount   `json:"mounts,omitempty"`
	// From is the snapshot the sandbox was created from, ForkOf the
	// sandbox it was forked from.
	From   string `json:"from,omitempty"`
	ForkOf string `json:"fork_of,omitempty"`
	// Owner is the id of the scoped token that created the sandbox (and
	// alone may use it, besides the admin); empty for the admin's.
	Owner string `json:"owner,omitempty"`
	// DiskUsed is the bytes the sandbox's writable layer holds (as of the
	// last reading).
	DiskUsed Size `json:"disk_used,omitempty"`
	// Resumed says how the last resume went: "thawed" (a pause ended,
	// processes continued), "restored" (memory came back from a
	// checkpoint) or "restarted" (files kept, processes started anew).
	Resumed string `json:"resumed,omitempty"`
	// Address is the sandbox's address on den's bridge (networked modes).
	Address string `json:"address,omitempty"`
	// Usage is what the sandbox has used over its whole life, for billing
	// by time alive or by time active.
	Usage     Usage     `json:"usage"`
	CreatedAt time.Time `json:"created_at"`
	StartedAt time.Time `json:"started_at,omitzero"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Pid is the host pid of the sandbox's agent (PID 1 inside), while running.
	Pid int `json:"pid,omitempty"`
}

// Limits are a sandbox's resource limits. Zero means the daemon's default.
type Limits struct {
	CPUs   float64 `json:"cpus,omitempty"`
	Memory Size    `json:"memory,omitempty"`
	Pids   int     `json:"pids,omitempty"`
	// Disk caps the bytes the sandbox's writable layer may hold, enforced
	// by the kernel (writes past it fail with a quota error inside). Zero:
	// the daemon's default (den serve --default-disk) or the token's cap.
	Disk Size `json:"disk,omitempty"`
}

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	Name  string `json:"name,omitempty"`
	Image string `json:"image,omitempty"` // default "host"
	// Runtime is the isolation tier: linux, gvisor or microvm (default:
	// the daemon's, see GET /v1/info).
	Runtime string            `json:"runtime,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	Env     []string          `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
	Limits  Limits            `json:"limits,omitzero"`
	TTL     Duration          `json:"ttl,omitempty"`
	// IdleTimeout: see Sandbox.IdleTimeout.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	// IdleAction: see Sandbox.IdleAction.
	IdleAction string         `json:"idle_action,omitempty"`
	Network    *NetworkPolicy `json:"network,omitempty"`
	// ShmSize sizes /dev/shm, a tmpfs in the sandbox's memory: 1 MiB to
	// the sandbox's memory limit (0: 64 MiB, as Docker's --shm-size).
	ShmSize Size `json:"shm_size,omitempty"`
	// StopSignal is the signal a stop (den stop, the idle timeout,
	// hibernation without a memory checkpoint) sends every process first:
	// a name with or without SIG, or a number (default TERM, as Docker's
	// --stop-signal). StopTimeout is how long the stop then waits for the
	// processes to end before it kills what is left: 0 to 5m (default
	// 10s, as Docker's --stop-timeout; 0 kills at once).
	StopSignal  string    `json:"stop_signal,omitempty"`
	StopTimeout *Duration `json:"stop_timeout,omitempty"`
	// From creates the sandbox from a snapshot (its files, and its image,
	// environment and limits unless the request sets them).
	From    string        `json:"from,omitempty"`
	Volumes []VolumeMount `json:"volumes,omitempty"`
	Mounts  []BindMount   `json:"mounts,omitempty"`
	// Git clones a repository into /workspace (see GitSource).
	Git *GitSource `json:"git,omitempty"`
}

// Limits of an exec request, checked before anything runs. Linux refuses
// to exec a program whose single argument or environment string is over
// MAX_ARG_STRLEN (32 pages: 131072 bytes with its NUL) or whose argv and
// envp together (each string, its NUL and its pointer) are over a quarter
// of the stack limit (2 MiB with the usual 8 MiB stack: getconf ARG_MAX).
const (
	// MaxArgLen bounds one element of cmd or env, and shell.
	MaxArgLen = 128<<10 - 1
	// MaxArgTotal bounds cmd (or shell) and env together, each string
	// counted with its NUL and an 8-byte pointer, as the kernel counts.
	MaxArgTotal = 2 << 20
	// MaxExecStdin bounds the stdin field: larger input is streamed to a
	// background process (POST .../processes, then .../processes/{proc}/stdin).
	MaxExecStdin = 1 << 20
	// MaxExecBody bounds the JSON body of an exec request: the arguments,
	// the environment and base64 stdin, with room for JSON escaping.
	MaxExecBody = 4 << 20
)

// ArgBytes is what argv and envp strings take of the kernel's limit: each
// string, its NUL and its pointer.
func ArgBytes(ss ...string) int {
	n := 0
	for _, s := range ss {
		n += len(s) + 1 + 8
	}
	return n
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
//
// Exactly one of Cmd (an argv) and Shell (a string run by /bin/sh -c) is set.
type ExecRequest struct {
	Cmd     []string `json:"cmd,omitempty"`
	Shell   string   `json:"shell,omitempty"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	User    string   `json:"user,omitempty"`
	// Stdin is written to the command's standard input, which is then closed.
	// Without it the command's stdin is /dev/null.
	Stdin   []byte   `json:"stdin,omitempty"`
	Timeout Duration `json:"timeout,omitempty"`
	// Session runs the command in the named shell session of the sandbox
	// (created on first use): the working directory, variables and shell
	// functions one command leaves are there for the next. Shell runs in
	// the session's shell as it is, Cmd with each argument quoted. Commands of a
	// session run one at a time; a timeout ends the session.
	Session string `json:"session,omitempty"`
	// Restart and Name apply to background processes (POST .../processes):
	// "always" or "on-failure" make the process a service that is started
	// again, with backoff, when it ends, and again when the sandbox starts.
	// Name names the process in every .../processes/{proc} route, in
	// place of its id; a name shaped like an id ("p12") is refused.
	Restart string `json:"restart,omitempty"`
	Name    string `json:"name,omitempty"`
	// TTY starts a background process on a terminal of the given size;
	// attach to it with the WebSocket at .../processes/{proc}/tty.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Exit reasons.
const (
	ReasonExited   = "exited"   // the command exited by itself; see ExitCode
	ReasonSignaled = "signaled" // killed by a signal; see Signal
	ReasonTimeout  = "timeout"  // the server-side timeout killed its process group
	ReasonOOM      = "oom"      // killed by the out-of-memory killer
	ReasonFailed   = "failed"   // it could not be started; see Error
)

// ExitStatus is how a command ended.
type ExitStatus struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason"`
	Error    string `json:"error,omitempty"`
	// Duration is the wall time from start to exit.
	Duration Duration `json:"duration"`
	// CPU is user+system CPU time of the command and its reaped children.
	CPU Duration `json:"cpu,omitempty"`
	// MaxRSS is the peak resident set size of the largest process, in bytes.
	MaxRSS int64 `json:"max_rss,omitempty"`
	// Denied lists the connections and DNS queries den's egress refused
	// the command while it ran (foreground execs through the API; at most
	// MaxDenied destinations, the event log has them all).
	Denied []DeniedConn `json:"denied,omitempty"`
}

// DeniedConn is the refused connections (or DNS queries) of a command to
// one destination for one rule.
type DeniedConn struct {
	// Host is the name connected to or queried (TLS SNI, HTTP Host, proxy
	// target), or the address when there was no name.
	Host string `json:"host"`
	Port int    `json:"port"`
	// Proto is "tcp" for a connection, "dns" for a DNS query.
	Proto string `json:"proto"`
	// Rule is the short, stable rule that refused it: "name not in allow
	// list", "address not public", … (the status line of an HTTP refusal).
	Rule string `json:"rule"`
	// Reason is the whole reason of the first refusal.
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}

// MaxDenied bounds ExitStatus.Denied.
const MaxDenied = 64

// ExecResult is the JSON answer of a non-streaming exec.
type ExecResult struct {
	ExitStatus
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
	// Truncated is set when output went past the capture limit; use the
	// streaming form for large output.
	Truncated bool `json:"truncated,omitempty"`
}

// FileInfo describes one file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits and setuid/setgid/sticky
	ModTime time.Time `json:"mod_time"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Target  string    `json:"target,omitempty"` // symlink target
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
	Parents bool   `json:"parents,omitempty"`
}

// RenameRequest is the body of POST /v1/sandboxes/{id}/files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Image is the record of one image.
type Image struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	// Base is "host" for images made from the built-in host image (by
	// commit or build); their layers sit above the host's directories:
	// Layers above "/", MountLayers above other mount points like "/usr".
	Base        string              `json:"base,omitempty"`
	Layers      []string            `json:"layers,omitempty"`
	MountLayers map[string][]string `json:"mount_layers,omitempty"`
	Size        int64               `json:"size"`
	CreatedAt   time.Time           `json:"created_at"`
	Config      ImageConfig         `json:"config,omitzero"`
	// Owner is the scoped token that imported, built or committed the
	// image; empty for the admin's, and shown to the admin and that token
	// only.
	Owner string `json:"owner,omitempty"`
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	Ref string `json:"ref"` // like docker.io/library/alpine:3.20 or alpine
	// Name stores the image under another name than the reference.
	Name     string `json:"name,omitempty"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// Insecure allows a registry on plain HTTP.
	Insecure bool   `json:"insecure,omitempty"`
	Platform string `json:"platform,omitempty"` // default linux/<the host's architecture>
}

// CommitRequest is the body of POST /v1/sandboxes/{id}/commit.
type CommitRequest struct {
	Name string `json:"name"`
	// Config, when given, replaces the new image's configuration; by
	// default it is the parent image's with the sandbox's env, workdir and
	// user applied.
	Config *ImageConfig `json:"config,omitempty"`
}

// ImageConfig is the part of an image's configuration applied to sandboxes.
type ImageConfig struct {
	Env          []string          `json:"env,omitempty"`
	Workdir      string            `json:"workdir,omitempty"`
	User         string            `json:"user,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// Event is one entry of the event log.
type Event struct {
	Seq     int64           `json:"seq"`
	Time    time.Time       `json:"time"`
	Sandbox string          `json:"sandbox,omitempty"`
	Type    string          `json:"type"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// VersionInfo is the answer of GET /v1/version.
type VersionInfo struct {
	Version  string   `json:"version"`
	Go       string   `json:"go"`
	Runtimes []string `json:"runtimes"`
	Cgroup   string   `json:"cgroup,omitempty"`
}

// Info is the answer of GET /v1/info: what this daemon runs and how.
type Info struct {
	Version string `json:"version"`
	// Runtimes are the isolation tiers den knows, available or not.
	Runtimes []RuntimeInfo `json:"runtimes"`
	Cgroup   string        `json:"cgroup,omitempty"`
	// Storage is how sandbox files are kept: "btrfs" (snapshots, quotas)
	// or "dir".
	Storage string `json:"storage,omitempty"`
	// StorageSize is the size of den's storage, StorageReserve the part
	// of it no sandbox, snapshot or volume may take, and DefaultDisk the
	// disk quota of sandboxes and volumes that set none (0: unlimited, or
	// no quotas).
	StorageSize    Size `json:"storage_size,omitempty"`
	StorageReserve Size `json:"storage_reserve,omitempty"`
	DefaultDisk    Size `json:"default_disk,omitempty"`
	// Network says whether sandboxes can have networked modes.
	Network bool `json:"network"`
	// Listeners are the addresses the daemon serves, like
	// tcp://127.0.0.1:7420 and unix:///run/den/den.sock: a client on the
	// unix socket finds there the TCP listener a browser reaches previews on.
	Listeners []string `json:"listeners,omitempty"`
	// PreviewDomain is the domain of host-name previews (PORT-ID.DOMAIN):
	// --preview-domain, or localhost (see Preview.Host).
	PreviewDomain string `json:"preview_domain,omitempty"`
	// SSH describes den's SSH gateway while it runs (den serve --ssh).
	SSH *SSHGateway `json:"ssh,omitempty"`
}

// SSHGateway is den's SSH gateway, for clients to connect to it and pin
// its host key.
type SSHGateway struct {
	// Addr is the address the gateway listens on, like 127.0.0.1:2222.
	Addr string `json:"addr"`
	// HostKey is the gateway's public host key as an authorized_keys
	// line ("ssh-ed25519 AAAA...").
	HostKey string `json:"host_key"`
}

// RuntimeInfo describes one isolation tier on this host.
type RuntimeInfo struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Default   bool   `json:"default,omitempty"`
	// Reason says why an unavailable tier cannot run here, and what to do.
	Reason string `json:"reason,omitempty"`
	// Details say how the tier runs here: versions, gVisor's platform, the
	// microVM's accelerator (kvm or tcg) and guest kernel.
	Details map[string]string `json:"details,omitempty"`
}

// EscalateRequest is the body of POST /v1/sandboxes/{id}/escalate.
type EscalateRequest struct {
	// Runtime is the stronger tier to move to: gvisor or microvm.
	Runtime string `json:"runtime"`
}

// Process states. A process that was running when its sandbox was paused
// or hibernated is listed, while the sandbox sleeps, in the sandbox's
// state (StatePaused, StateHibernated).
const (
	ProcRunning = "running"
	ProcExited  = "exited"
)

// ProcessInfo describes a process started in a sandbox.
type ProcessInfo struct {
	ID   string `json:"id"`
	Pid  int    `json:"pid"`
	Name string `json:"name,omitempty"`
	// Restart is the service policy ("always", "on-failure") and Restarts
	// how often the service was started again.
	Restart  string      `json:"restart,omitempty"`
	Restarts int         `json:"restarts,omitempty"`
	Cmd      []string    `json:"cmd"`
	State    string      `json:"state"`
	Started  time.Time   `json:"started"`
	Ended    time.Time   `json:"ended,omitzero"`
	Exit     *ExitStatus `json:"exit,omitempty"`
	// Output is the total bytes written to stdout and stderr so far.
	Output int64 `json:"output"`
	// Descendants are the pids of the live processes the process started,
	// also those that left its process group or session (setsid) or
	// outlived it (a daemon): a kill of the process, and its timeout, end
	// them too.
	Descendants []int `json:"descendants,omitempty"`
}

// SignalRequest is the body of POST .../processes/{proc}/kill.
type SignalRequest struct {
	Signal string `json:"signal,omitempty"`
}

// Session describes a shell session of a sandbox.
type Session struct {
	Name    string    `json:"name"`
	Pid     int       `json:"pid"`
	Started time.Time `json:"started"`
	Busy    bool      `json:"busy"`
}

// Usage totals of a sandbox since it was created.
type Usage struct {
	CPUSeconds     float64 `json:"cpu_seconds"`
	MemoryGiBHours float64 `json:"memory_gib_hours"`
	// AliveSeconds counts time running; ActiveSeconds only time with API
	// activity (an exec, a file or process call) in it.
	AliveSeconds  float64 `json:"alive_seconds"`
	ActiveSeconds float64 `json:"active_seconds"`
	EgressBytes   int64   `json:"egress_bytes"`
}

// Stats is the answer of GET /v1/sandboxes/{id}/stats: live use and limits.
type Stats struct {
	ID          string   `json:"id"`
	CPU         Duration `json:"cpu"` // CPU time of the current run
	Memory      Size     `json:"memory"`
	MemoryLimit Size     `json:"memory_limit,omitempty"`
	Pids        int      `json:"pids"`
	PidsLimit   int      `json:"pids_limit,omitempty"`
	Disk        Size     `json:"disk"` // bytes in the sandbox's writable layer
	NetRxBytes  int64    `json:"net_rx_bytes"`
	NetTxBytes  int64    `json:"net_tx_bytes"`
	Usage       Usage    `json:"usage"`
}

// MaxTTYMessage bounds one WebSocket message on a terminal connection.
const MaxTTYMessage = 1 << 20

// TTYControl is a text message on a terminal WebSocket: from the client a
// resize or a signal, from the server the exit status as the last message.
type TTYControl struct {
	Resize *WindowSize `json:"resize,omitempty"`
	Signal string      `json:"signal,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
}

// WindowSize is a terminal's size in characters.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Network modes.
const (
	NetNone  = "none"  // loopback only (the default)
	NetAllow = "allow" // only the listed domains and CIDRs, on every TCP port
	NetOpen  = "open"  // any public address
)

// NetworkPolicy is a sandbox's egress policy. Private, loopback,
// link-local, CGNAT, multicast, IPv4-mapped, NAT64 and metadata addresses
// are blocked in every mode unless an allow_cidr names them.
type NetworkPolicy struct {
	Mode      string   `json:"mode,omitempty"`
	Allow     []string `json:"allow,omitempty"` // "example.com", "*.example.com"
	Deny      []string `json:"deny,omitempty"`
	AllowCIDR []string `json:"allow_cidr,omitempty"`
	// Limits, per sandbox: new connections per second, total bytes sent
	// out over the sandbox's life, and bandwidth each way (bytes/second).
	ConnRate  float64 `json:"conn_rate,omitempty"`
	MaxEgress Size    `json:"max_egress,omitempty"`
	Bandwidth Size    `json:"bandwidth,omitempty"`
	// SecretHeaders are added by den's proxy to HTTPS requests for their
	// host; the value never enters the sandbox.
	SecretHeaders []SecretHeader `json:"secret_headers,omitempty"`
}

// SecretHeader is a header den's proxy sets on requests to Host. Value
// may refer to secrets as ${NAME}: from den's secret store (den secret
// set NAME) or else the daemon's environment; it is stored as written and
// expanded only inside the proxy.
type SecretHeader struct {
	Host   string `json:"host"`
	Header string `json:"header"`
	Value  string `json:"value"`
}

// PortRequest is the body of POST /v1/sandboxes/{id}/ports.
type PortRequest struct {
	Port   int  `json:"port"`
	Public bool `json:"public,omitempty"` // no token needed
	// Rotate gives a private port that is already shared a new token (the
	// old one stops working); without it sharing again keeps the token.
	Rotate bool `json:"rotate,omitempty"`
}

// Preview is a port of a sandbox shared through den's reverse proxy.
type Preview struct {
	Port   int    `json:"port"`
	Public bool   `json:"public,omitempty"`
	Token  string `json:"token,omitempty"` // for private previews
	// Path is the preview's path on the daemon's listener (add the token
	// as ?den_token= or the X-Den-Token header); Host is the host name
	// form PORT-ID.DOMAIN, where the preview is the site's root (what dev
	// servers with root-relative URLs need): DOMAIN is the daemon's
	// --preview-domain, or localhost when it listens on TCP on this
	// host's loopback (browsers resolve *.localhost there), reached on
	// that listener's port.
	Path string `json:"path"`
	Host string `json:"host,omitempty"`
}
