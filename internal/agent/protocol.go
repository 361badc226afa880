package agent

// The agent protocol's paths: the one place they are named. The agent
// serves each (Handler builds its routes from them) and the daemon's
// requests (Client.Do, Client.JSON) name them the same way. The wire types
// are api's and this package's (ExecSpec); an exec answers with api's
// framed stream, read with api.ReadExecStream.
const (
	PathHealth   = "/healthz"      // GET: the agent answers
	PathExec     = "/exec"         // POST ExecSpec: an api framed stream to the exit frame
	PathFiles    = "/files"        // GET, PUT, DELETE ?path=: read, write, remove a file
	PathList     = "/files/list"   // GET ?path=: a directory's entries
	PathStat     = "/files/stat"   // GET ?path=: one file's
	PathMkdir    = "/files/mkdir"  // POST api.MkdirRequest
	PathRename   = "/files/rename" // POST api.RenameRequest
	PathGlob     = "/files/glob"   // GET ?pattern=
	PathGrep     = "/files/grep"   // GET ?pattern=
	PathArchive  = "/archive"      // GET, PUT ?path=[&owner=USER]: a tar of a tree, or one to unpack (owned by USER, else as archived)
	PathHostname = "/hostname"     // POST {"hostname"}
	PathLimits   = "/limits"       // POST {"pids"}: limits the agent enforces itself
	PathSessions = "/sessions"     // GET: the shell sessions; DELETE SessionPath(name)
	PathProcs    = "/procs"        // POST ExecSpec: start a background process; GET: list them
	PathDial     = "/dial"         // GET ?port=, upgraded: a TCP connection to the sandbox's loopback
	PathSync     = "/sync"         // POST: flush the sandbox's writes to its disk
	PathStop     = "/stop"         // POST StopRequest: signal every process, wait for them (a graceful stop's first half)
	ProcOutput   = "/output"       // ProcPath suffix, GET: the process's output as an api framed stream
	ProcSignal   = "/signal"       // ProcPath suffix, POST api.SignalRequest
	ProcStdin    = "/stdin"        // ProcPath suffix, POST the bytes (?close=true ends stdin)
	ProcWait     = "/wait"         // ProcPath suffix, GET: the api.ExitStatus once it ends
	ProcTTY      = "/tty"          // ProcPath suffix, GET, WebSocket: the process's terminal
)

// ProcPath is the path of background process id ("p12"), and with a
// suffix (ProcOutput, ProcSignal, ProcStdin, ProcWait, ProcTTY) of one of
// its calls; "" for the process itself (GET: its api.ProcessInfo).
func ProcPath(id, suffix string) string { return PathProcs + "/" + id + suffix }

// SessionPath is the path of the shell session with this name (escaped
// by the caller where it comes from a request).
func SessionPath(name string) string { return PathSessions + "/" + name }
