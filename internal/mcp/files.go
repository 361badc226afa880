package mcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// File tools. Every path goes to the daemon as given and is resolved by
// the sandbox's agent inside the sandbox (.., absolute paths and symlinks
// never leave it).

const (
	// readDefaultLines is how many lines read_file returns without limit.
	readDefaultLines = 2000
	// readMaxBytes bounds the text read_file returns.
	readMaxBytes = 256 << 10
	// readMaxLine cuts longer lines in read_file.
	readMaxLine = 4000
	// editMaxBytes bounds the files edit_file rewrites.
	editMaxBytes = 8 << 20
	// listMaxEntries bounds list_files.
	listMaxEntries = 5000
)

func (s *server) addFileTools(srv *sdk.Server) {
	addTool(s, srv, &sdk.Tool{Name: "read_file", Annotations: readOnly("Read a file"),
		Description: "Read a text file in a sandbox: up to limit lines (default 2000) from line offset (1-based), or the last tail lines. Long lines are cut and the text is bounded (256 KiB); total_lines tells how much there is."}, onSandbox(s, s.readFile))
	addTool(s, srv, &sdk.Tool{Name: "write_file", Annotations: changes("Write a file", true, true),
		Description: "Create or replace a file in a sandbox with the given text, creating its parent directories."}, onSandbox(s, s.writeFile))
	addTool(s, srv, &sdk.Tool{Name: "edit_file", Annotations: changes("Edit a file", true, false),
		Description: "Replace old_string with new_string in a file in a sandbox. old_string must match exactly (whitespace included) and occur expected_count times (default 1); otherwise nothing changes and the error shows the closest region of the file, with line numbers and what differs."}, onSandbox(s, s.editFile))
	addTool(s, srv, &sdk.Tool{Name: "list_files", Annotations: readOnly("List a directory"),
		Description: "List a directory in a sandbox: name, type, size, mode and modification time of each entry."}, onSandbox(s, s.listFiles))
	addTool(s, srv, &sdk.Tool{Name: "glob", Annotations: readOnly("Find files by pattern"),
		Description: "Find paths in a sandbox matching a glob such as **/*.go or src/*/test_*.py (** matches any number of directories), below path (default /). Works in every sandbox whatever its image has; symlinks are not followed."}, onSandbox(s, s.glob))
	addTool(s, srv, &sdk.Tool{Name: "grep", Annotations: readOnly("Search file contents"),
		Description: "Find lines matching a regular expression (RE2 syntax) in the files below path (default /) or in one file, optionally only in files matching glob (*.go matches names; a pattern with slashes matches the path below path). Returns path, line number and text of each match; binary and very large files are skipped."}, onSandbox(s, s.grep))
}

type readIn struct {
	sandboxArg
	Path   string `json:"path" jsonschema:"the file, absolute or relative to /"`
	Offset int    `json:"offset,omitempty" jsonschema:"the first line to return, 1-based (default 1)"`
	Limit  int    `json:"limit,omitempty" jsonschema:"at most this many lines (default 2000)"`
	Tail   int    `json:"tail,omitempty" jsonschema:"return the last this many lines instead"`
}

type readOut struct {
	Path       string `json:"path"`
	Content    string `json:"content" jsonschema:"the lines, each ending with its newline"`
	StartLine  int    `json:"start_line" jsonschema:"the number of the first line returned (0 when none)"`
	EndLine    int    `json:"end_line" jsonschema:"the number of the last line returned (0 when none)"`
	TotalLines int    `json:"total_lines"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"lines were cut, or the text bound was reached before limit"`
}

func (s *server) readFile(ctx context.Context, c *client.Client, id string, in readIn) (readOut, error) {
	switch {
	case in.Path == "":
		return readOut{}, errors.New("invalid: path is empty")
	case in.Offset < 0 || in.Limit < 0 || in.Tail < 0:
		return readOut{}, errors.New("invalid: offset, limit and tail must not be negative")
	case in.Tail > 0 && in.Offset > 0:
		return readOut{}, errors.New("invalid: give offset or tail, not both")
	}
	rc, err := c.ReadFile(ctx, id, in.Path)
	if err != nil {
		return readOut{}, err
	}
	defer rc.Close()
	out, err := readLines(rc, in)
	if err != nil {
		return readOut{}, err
	}
	out.Path = in.Path
	return *out, nil
}

// readLines picks the lines read_file returns from r.
func readLines(r io.Reader, in readIn) (*readOut, error) {
	limit := in.Limit
	if limit == 0 {
		limit = readDefaultLines
	}
	first := max(in.Offset, 1)
	br := bufio.NewReaderSize(r, 64<<10)
	out := &readOut{}
	var kept []string // with tail: a ring of the last lines
	size := 0
	for n := 1; ; n++ {
		line, err := br.ReadString('\n')
		if line == "" && err != nil {
			if err != io.EOF {
				return nil, fmt.Errorf("read the file: %w", err)
			}
			break
		}
		out.TotalLines = n
		if n == 1 && strings.IndexByte(line[:min(len(line), 8000)], 0) >= 0 {
			return nil, errors.New("invalid: this is a binary file, not text: use exec (like od -c or base64) to look at it")
		}
		if len(line) > readMaxLine {
			line = strings.ToValidUTF8(line[:readMaxLine], "") + " [line cut]\n"
			out.Truncated = true
		}
		if in.Tail > 0 {
			kept = append(kept, line)
			if len(kept) > in.Tail {
				kept = kept[1:]
			}
			continue
		}
		if n < first || n >= first+limit {
			continue
		}
		if size+len(line) > readMaxBytes {
			out.Truncated = true
			continue
		}
		size += len(line)
		kept = append(kept, line)
		if out.StartLine == 0 {
			out.StartLine = n
		}
		out.EndLine = n
	}
	if in.Tail > 0 {
		for size = 0; len(kept) > 0 && sumLen(kept) > readMaxBytes; kept = kept[1:] {
			out.Truncated = true
		}
		if len(kept) > 0 {
			out.StartLine, out.EndLine = out.TotalLines-len(kept)+1, out.TotalLines
		}
	}
	out.Content = strings.ToValidUTF8(strings.Join(kept, ""), "\uFFFD")
	return out, nil
}

func sumLen(v []string) int {
	n := 0
	for _, s := range v {
		n += len(s)
	}
	return n
}

type writeIn struct {
	sandboxArg
	Path    string `json:"path" jsonschema:"the file, absolute or relative to /"`
	Content string `json:"content" jsonschema:"the whole new content"`
	Mode    string `json:"mode,omitempty" jsonschema:"octal permissions like 0755 (default: 0644, or the file's own)"`
}

type fileOut struct {
	File *api.FileInfo `json:"file"`
}

func (s *server) writeFile(ctx context.Context, c *client.Client, id string, in writeIn) (fileOut, error) {
	if in.Path == "" {
		return fileOut{}, errors.New("invalid: path is empty")
	}
	var mode os.FileMode
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 || m == 0 {
			return fileOut{}, fmt.Errorf("invalid: mode %q is not octal permissions like 0644", in.Mode)
		}
		mode = client.FileMode(uint32(m))
	} else if fi, err := statFollow(ctx, c, id, in.Path); err == nil && fi.Type == "file" {
		mode = client.FileMode(fi.Mode) // keep an existing file's mode
	}
	fi, err := c.WriteFile(ctx, id, in.Path, strings.NewReader(in.Content), mode)
	return fileOut{File: fi}, err
}

type editIn struct {
	sandboxArg
	Path          string `json:"path" jsonschema:"the file, absolute or relative to /"`
	OldString     string `json:"old_string" jsonschema:"the exact text to replace, whitespace and indentation included"`
	NewString     string `json:"new_string" jsonschema:"the text to put in its place"`
	ExpectedCount int    `json:"expected_count,omitempty" jsonschema:"how many times old_string occurs; all are replaced (default 1)"`
}

type editOut struct {
	Path         string `json:"path"`
	Replacements int    `json:"replacements"`
	FirstLine    int    `json:"first_line" jsonschema:"the line where the first replacement starts"`
}

func (s *server) editFile(ctx context.Context, c *client.Client, id string, in editIn) (editOut, error) {
	want := in.ExpectedCount
	switch {
	case in.Path == "":
		return editOut{}, errors.New("invalid: path is empty")
	case in.OldString == "":
		return editOut{}, errors.New("invalid: old_string is empty: to create or replace a whole file use write_file")
	case in.OldString == in.NewString:
		return editOut{}, errors.New("invalid: old_string and new_string are the same: nothing to change")
	case want < 0:
		return editOut{}, errors.New("invalid: expected_count must be positive")
	case want == 0:
		want = 1
	}
	fi, err := statFollow(ctx, c, id, in.Path)
	if err != nil {
		return editOut{}, err
	}
	if fi.Type != "file" {
		return editOut{}, fmt.Errorf("invalid: %s is a %s, not a file", in.Path, fi.Type)
	}
	if fi.Size > editMaxBytes {
		return editOut{}, fmt.Errorf("too_large: %s has %d bytes; edit_file rewrites files up to %d (use exec with sed or patch)", in.Path, fi.Size, editMaxBytes)
	}
	rc, err := c.ReadFile(ctx, id, fi.Path)
	if err != nil {
		return editOut{}, err
	}
	old, err := io.ReadAll(io.LimitReader(rc, editMaxBytes+1))
	rc.Close()
	if err != nil {
		return editOut{}, fmt.Errorf("read %s: %w", in.Path, err)
	}
	text := string(old)
	n := strings.Count(text, in.OldString)
	switch {
	case n == 0:
		return editOut{}, errors.New("not_found: old_string does not occur in " + in.Path + "; nothing was changed.\n" + nearMiss(text, in.OldString))
	case n != want:
		return editOut{}, fmt.Errorf("conflict: old_string occurs %d times in %s (at lines %s), expected %d; nothing was changed. Add surrounding lines to old_string to pick one, or set expected_count to %d to replace them all",
			n, in.Path, lineList(text, in.OldString, 10), want, n)
	}
	firstLine := strings.Count(text[:strings.Index(text, in.OldString)], "\n") + 1
	updated := strings.ReplaceAll(text, in.OldString, in.NewString)
	if _, err := c.WriteFile(ctx, id, fi.Path, bytes.NewReader([]byte(updated)), client.FileMode(fi.Mode)); err != nil {
		return editOut{}, err
	}
	return editOut{Path: in.Path, Replacements: n, FirstLine: firstLine}, nil
}

// statFollow describes the file p names, following symlinks (each one
// resolved inside the sandbox by the daemon, like every path), so an edit
// of a link changes its target and keeps the target's mode.
func statFollow(ctx context.Context, c *client.Client, id, p string) (*api.FileInfo, error) {
	for hops := 0; ; hops++ {
		fi, err := c.Stat(ctx, id, p)
		if err != nil || fi.Type != "symlink" {
			return fi, err
		}
		if hops == 40 {
			return nil, fmt.Errorf("invalid: %s: too many levels of symbolic links", p)
		}
		if p = fi.Target; !path.IsAbs(p) {
			p = path.Join(path.Dir(fi.Path), p)
		}
	}
}

// lineList names the lines where sub starts in text (at most max of them).
func lineList(text, sub string, max int) string {
	var out []string
	line, off := 1, 0
	for len(out) < max {
		i := strings.Index(text[off:], sub)
		if i < 0 {
			return strings.Join(out, ", ")
		}
		line += strings.Count(text[off:off+i], "\n")
		out = append(out, strconv.Itoa(line))
		line += strings.Count(sub, "\n")
		off += i + len(sub)
	}
	return strings.Join(out, ", ") + ", ..."
}

type pathIn struct {
	sandboxArg
	Path string `json:"path" jsonschema:"the directory, absolute or relative to /"`
}

type listOut struct {
	Entries   []*api.FileInfo `json:"entries"`
	Truncated bool            `json:"truncated,omitempty" jsonschema:"only the first 5000 entries are listed"`
}

func (s *server) listFiles(ctx context.Context, c *client.Client, id string, in pathIn) (listOut, error) {
	if in.Path == "" {
		return listOut{}, errors.New("invalid: path is empty (use / for the root)")
	}
	list, err := c.ListDir(ctx, id, in.Path)
	if err != nil {
		return listOut{}, err
	}
	out := listOut{Entries: orEmpty(list)}
	if len(out.Entries) > listMaxEntries {
		out.Entries, out.Truncated = out.Entries[:listMaxEntries], true
	}
	return out, nil
}

type globIn struct {
	sandboxArg
	Pattern string `json:"pattern" jsonschema:"a glob like **/*.go; ** matches any number of directories"`
	Path    string `json:"path,omitempty" jsonschema:"the directory the pattern is relative to (default /)"`
	Limit   int    `json:"limit,omitempty" jsonschema:"at most this many paths (default 1000, at most 10000)"`
}

func (s *server) glob(ctx context.Context, c *client.Client, id string, in globIn) (api.GlobResult, error) {
	res, err := c.Glob(ctx, id, in.Pattern, client.GlobOptions{Path: in.Path, Limit: in.Limit})
	if err != nil {
		return api.GlobResult{}, err
	}
	return *res, nil
}

type grepIn struct {
	sandboxArg
	Pattern    string `json:"pattern" jsonschema:"a regular expression (RE2 syntax), like func \\w+\\("`
	Path       string `json:"path,omitempty" jsonschema:"the directory to search below, or one file (default /)"`
	Glob       string `json:"glob,omitempty" jsonschema:"only files matching this glob, like *.go"`
	IgnoreCase bool   `json:"ignore_case,omitempty"`
	Limit      int    `json:"limit,omitempty" jsonschema:"at most this many matching lines (default 1000, at most 10000)"`
}

func (s *server) grep(ctx context.Context, c *client.Client, id string, in grepIn) (api.GrepResult, error) {
	res, err := c.Grep(ctx, id, in.Pattern, client.GrepOptions{Path: in.Path, Glob: in.Glob, IgnoreCase: in.IgnoreCase, Limit: in.Limit})
	if err != nil {
		return api.GrepResult{}, err
	}
	return *res, nil
}
