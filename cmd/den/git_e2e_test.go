package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/den-dev/den/internal/gitws/gitwstest"
	"github.com/den-dev/den/internal/testenv/e2e"
)

// docExample returns the commands of the first ```sh block after the line
// heading (the file's first block when heading is ""), continuation lines
// joined, without the commands that name an https URL: the test daemon has
// no network to clone from.
func docExample(t *testing.T, file, heading string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []string
	found, in, cont := heading == "", false, ""
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case !found:
			found = line == heading
		case !in:
			in = line == "```sh"
		case line == "```":
			if len(cmds) == 0 {
				t.Fatalf("%s: the example after %q has no command den's test daemon can run", file, heading)
			}
			return cmds
		case strings.HasSuffix(line, `\`):
			cont += strings.TrimSuffix(line, `\`)
		default:
			if cmd := cont + line; !strings.Contains(cmd, "https://") {
				cmds = append(cmds, cmd)
			}
			cont = ""
		}
	}
	t.Fatalf("%s: no ```sh block after %q", file, heading)
	return nil
}

// runDocExample runs the commands of an example (docExample) with den
// against d, in a new directory, with HOME holding ~/src/app: a host
// repository whose make test changes a tracked file. It checks the example
// still has the commands must names, and returns the repository, the
// directory and the value of $id at the end.
func runDocExample(t *testing.T, d *daemon, file, heading string, must []string) (app, work, id string) {
	t.Helper()
	script := strings.Join(docExample(t, file, heading), "\n")
	for _, m := range must {
		if !strings.Contains(script, m) {
			t.Fatalf("the example in %s no longer has %q: update this test with it\n%s", file, m, script)
		}
	}
	home := t.TempDir()
	app = filepath.Join(home, "src", "app")
	os.MkdirAll(app, 0o755)
	gitwstest.Git(t, app, "init", "-q")
	os.WriteFile(filepath.Join(app, "Makefile"), []byte("test:\n\techo passed > test-result.txt\n"), 0o644)
	os.WriteFile(filepath.Join(app, "test-result.txt"), []byte("not run\n"), 0o644)
	gitwstest.Git(t, app, "add", "-A")
	gitwstest.Git(t, app, "commit", "-qm", "first")
	gitwstest.Git(t, app, "config", "user.name", "App Dev")
	gitwstest.Git(t, app, "config", "user.email", "dev@example.com")
	work = t.TempDir()
	cmd := exec.Command("/bin/sh", "-ex", "-c", script+"\necho \"ID=$id\"")
	cmd.Dir = work
	cmd.Env = []string{"DEN_HOST=" + d.addr, "DEN_TOKEN=" + d.token, "HOME=" + home,
		"PATH=" + filepath.Dir(e2e.DenBinary(t)) + ":/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the example of %s fails: %v\n%s", file, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(l, "ID="); ok {
			id = s
		}
	}
	if len(id) < 12 {
		t.Fatalf("the example of %s left no sandbox id in $id:\n%s", file, out)
	}
	return app, work, id
}

// The git examples of README.md and docs/git.md, run as they are written
// (read from the files, so they cannot drift) with den against a real
// daemon: git commit inside works out of the box, and diff and export give
// the change back.
func TestGitDocExamples(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("the examples run make inside the sandbox (apt-get install make)")
	}
	d := newDaemon(t)
	for _, tc := range []struct {
		file, heading, branch string
		must                  []string // commands the example must keep
		commits               string   // subjects on the exported branch, newest first
	}{
		{"README.md", "### Git workspaces and the agent in the box", "agent/fix",
			[]string{"den create --git ~/src/app", "git commit -qam fix", "den diff --stat", "den export"}, "fix"},
		{"docs/git.md", "", "agent/fix-tests",
			[]string{"den create --git ~/src/app", "make test", "den diff", "den export"}, "den: changes in sandbox ID"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			app, work, id := runDocExample(t, d, tc.file, tc.heading, tc.must)
			got := gitwstest.Git(t, app, "log", "--format=%s|%an <%ae>", "main.."+tc.branch)
			want := strings.ReplaceAll(tc.commits, "ID", id[:12]) + "|App Dev <dev@example.com>"
			if got != want {
				t.Errorf("commits on %s: %q, want %q", tc.branch, got, want)
			}
			if s := gitwstest.Git(t, app, "show", tc.branch+":test-result.txt"); s != "passed" {
				t.Errorf("%s:test-result.txt is %q", tc.branch, s)
			}
			patches, _ := filepath.Glob(filepath.Join(work, "*.patch"))
			if len(patches) != 1 {
				t.Fatalf("patches written: %v", patches)
			}
			if b, _ := os.ReadFile(patches[0]); !strings.Contains(string(b), "+passed") {
				t.Errorf("%s lacks the change:\n%s", patches[0], b)
			}
		})
	}
	t.Run("docs/git.md forks", func(t *testing.T) {
		app, _, _ := runDocExample(t, d, "docs/git.md", "## Forks: try several ways, export the winner",
			[]string{"den fork $id -n 2", "den diff --stat $1", "den export $2 --branch agent/winner"})
		if got := gitwstest.Git(t, app, "show", "agent/winner:notes.txt", "agent/winner:way.txt"); got != "shared start\ntwo" {
			t.Errorf("agent/winner holds %q, want the shared start and the second way", got)
		}
	})
}
