package api

// GitSource makes a sandbox a git workspace: the repository is cloned by
// the daemon and checked out in /workspace on a new branch den/<sandbox id>
// with a .git of its own, owned by the sandbox's user.
type GitSource struct {
	// URL is an https, http, git or ssh URL (or user@host:path), cloned by
	// the daemon on the host; or, for the admin only, a host repository
	// as an absolute path or a file:// URL (export writes back there).
	URL string `json:"url"`
	// Branch (or tag) to start from; default the repository's default branch.
	Branch string `json:"branch,omitempty"`
	// Author is "Name <email>", set as user.name and user.email in
	// /workspace/.git/config so that git commit works inside, and the
	// author of the commit den makes of uncommitted changes. Default: the
	// host repository's user.name and user.email (for a host path: its
	// config, then its owner's global config), else "den <den@localhost>".
	Author string `json:"author,omitempty"`
}

// Diff is the answer of GET /v1/sandboxes/{id}/diff: what changed in a git
// workspace since its base commit, committed inside or not.
type Diff struct {
	Source string `json:"source"` // what the workspace was cloned from
	Branch string `json:"branch"` // the branch inside the sandbox
	Base   string `json:"base"`   // the commit the workspace started from
	// Head is a commit (in the daemon's repository) holding the
	// workspace's files as they are; base..head are the commits an
	// export writes.
	Head string `json:"head"`
	// Commits are base..head, oldest first: those made inside, then one
	// with the uncommitted changes if there are any.
	Commits []DiffCommit `json:"commits"`
	Files   []DiffFile   `json:"files"`
	// Patch is `git diff --binary base head` (base64 in JSON): binary
	// files, modes and symlinks included; `git apply` takes it.
	Patch []byte `json:"patch"`
}

// DiffCommit is one commit of a Diff.
type DiffCommit struct {
	Commit  string `json:"commit"`
	Subject string `json:"subject"`
}

// DiffFile is one changed path: status A (added), M (modified, content or
// mode), D (deleted), R (renamed, with old_path), T (type changed).
type DiffFile struct {
	Path    string `json:"path"`
	Status  string `json:"status"`
	OldPath string `json:"old_path,omitempty"`
}

// ExportRequest is the body of POST /v1/sandboxes/{id}/export.
type ExportRequest struct {
	// Branch of the host repository to write (created, or moved forward).
	Branch string `json:"branch"`
	// Message of the commit holding the uncommitted changes (default
	// "den: changes in sandbox ID").
	Message string `json:"message,omitempty"`
	// Force moves an existing branch even when the changes do not
	// descend from it.
	Force bool `json:"force,omitempty"`
}

// ExportResult is the answer of POST /v1/sandboxes/{id}/export.
type ExportResult struct {
	Repository string `json:"repository"` // the host repository written
	Branch     string `json:"branch"`
	Commit     string `json:"commit"`             // the branch's new commit
	Base       string `json:"base"`               // the commit the workspace started from
	Previous   string `json:"previous,omitempty"` // the branch's commit before, if it existed
	Commits    int    `json:"commits"`            // commits base..commit
}
