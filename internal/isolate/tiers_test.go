package isolate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The tiers' sources, read as text (go/parser): which packages are tiers,
// what they import, which abilities they assert. No build, no root.

// moduleRoot is the directory of go.mod above the test's, and the
// module's path.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if m, ok := strings.CutPrefix(line, "module "); ok {
					return dir, strings.TrimSpace(m)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = filepath.Dir(dir)
	}
}

// parseDir parses the Go files of dir (test files too if tests), with
// their imports only if importsOnly.
func parseDir(t *testing.T, dir string, tests, importsOnly bool) []*ast.File {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mode := parser.SkipObjectResolution
	if importsOnly {
		mode |= parser.ImportsOnly
	}
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || (!tests && strings.HasSuffix(n, "_test.go")) {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, n), nil, mode)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// tiers are the packages directly under internal/isolate that declare a
// type Runtime: every isolation tier, a new one too.
func tiers(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, "internal/isolate"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		for _, f := range parseDir(t, filepath.Join(root, "internal/isolate", e.Name()), false, false) {
			if declares(f, "Runtime") {
				out = append(out, e.Name())
				break
			}
		}
	}
	if len(out) < 3 {
		t.Fatalf("tiers found: %v; want linux, gvisor and microvm at least", out)
	}
	return out
}

func declares(f *ast.File, name string) bool {
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				if s.(*ast.TypeSpec).Name.Name == name {
					return true
				}
			}
		}
	}
	return false
}

// TestTiersIndependent: no tier imports another, directly or through any
// package of this module it imports (tests included for the tier's own
// package). What they share lives in internal/host or internal/isolate.
func TestTiersIndependent(t *testing.T) {
	root, module := moduleRoot(t)
	all := tiers(t, root)
	tierOf := func(pkg string) string {
		rel, ok := strings.CutPrefix(pkg, module+"/internal/isolate/")
		if !ok {
			return ""
		}
		first, _, _ := strings.Cut(rel, "/")
		if slices.Contains(all, first) {
			return first
		}
		return ""
	}
	for _, tier := range all {
		start := module + "/internal/isolate/" + tier
		via := map[string]string{start: ""} // package → the package that imports it
		queue := []string{start}
		for len(queue) > 0 {
			pkg := queue[0]
			queue = queue[1:]
			dir := filepath.Join(root, strings.TrimPrefix(pkg, module))
			for _, f := range parseDir(t, dir, pkg == start, true) {
				for _, im := range f.Imports {
					p, _ := strconv.Unquote(im.Path.Value)
					if p != module && !strings.HasPrefix(p, module+"/") {
						continue
					}
					if _, seen := via[p]; seen {
						continue
					}
					via[p] = pkg
					if other := tierOf(p); other != "" && other != tier {
						chain := []string{p}
						for q := pkg; q != ""; q = via[q] {
							chain = append(chain, q)
						}
						slices.Reverse(chain)
						t.Errorf("tier %s imports tier %s: %s", tier, other, strings.Join(chain, " → "))
						continue
					}
					queue = append(queue, p)
				}
			}
		}
	}
}

// abilities are isolate's interfaces, by name, with their methods' names.
func abilities(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range parseDir(t, filepath.Join(root, "internal/isolate"), false, false) {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if it, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() {
				var methods []string
				for _, m := range it.Methods.List {
					for _, n := range m.Names {
						methods = append(methods, n.Name)
					}
				}
				out[ts.Name.Name] = methods
			}
			return false
		})
	}
	if len(out) < 3 {
		t.Fatalf("isolate's interfaces: %v", out)
	}
	return out
}

// assertions reads a tier's "var _ isolate.X = (*T)(nil)" lines: the
// abilities each of its types asserts, by type name.
func assertions(files []*ast.File) map[string][]string {
	out := map[string][]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if len(vs.Names) != 1 || vs.Names[0].Name != "_" || len(vs.Values) != 1 {
					continue
				}
				sel, ok := vs.Type.(*ast.SelectorExpr)
				if !ok {
					continue
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "isolate" {
					continue
				}
				// (*T)(nil)
				call, ok := vs.Values[0].(*ast.CallExpr)
				if !ok {
					continue
				}
				par, ok := call.Fun.(*ast.ParenExpr)
				if !ok {
					continue
				}
				star, ok := par.X.(*ast.StarExpr)
				if !ok {
					continue
				}
				if id, ok := star.X.(*ast.Ident); ok {
					out[id.Name] = append(out[id.Name], sel.Sel.Name)
				}
			}
		}
	}
	return out
}

// methods are the names of the methods declared on each type.
func methods(files []*ast.File) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil {
				continue
			}
			rt := fd.Recv.List[0].Type
			if s, ok := rt.(*ast.StarExpr); ok {
				rt = s.X
			}
			if id, ok := rt.(*ast.Ident); ok {
				if out[id.Name] == nil {
					out[id.Name] = map[string]bool{}
				}
				out[id.Name][fd.Name.Name] = true
			}
		}
	}
	return out
}

// tierAbilities are the abilities each tier asserts, as "Runtime: ..."
// and "Box: ..." sets: its type asserting isolate.Runtime and the one
// asserting isolate.Box. It fails the test where a tier's runtime or box
// has an ability's methods without asserting it (a method renamed in one
// tier, or in isolate, then goes unnoticed: the ability is silently lost),
// or a tier asserts no Runtime or no Box.
func tierAbilities(t *testing.T, root string) map[string]map[string]bool {
	t.Helper()
	abs := abilities(t, root)
	out := map[string]map[string]bool{}
	for _, tier := range tiers(t, root) {
		files := parseDir(t, filepath.Join(root, "internal/isolate", tier), false, false)
		asserted, ms := assertions(files), methods(files)
		out[tier] = map[string]bool{}
		for _, base := range []string{"Runtime", "Box"} {
			var typ string
			for ty, as := range asserted {
				if slices.Contains(as, base) {
					typ = ty
				}
			}
			if typ == "" {
				t.Errorf("tier %s asserts no isolate.%s (var _ isolate.%s = (*T)(nil))", tier, base, base)
				continue
			}
			for name, want := range abs {
				has := len(want) > 0
				for _, m := range want {
					has = has && ms[typ][m]
				}
				if slices.Contains(asserted[typ], name) {
					if name != base {
						out[tier][name] = true
					}
				} else if has {
					t.Errorf("tier %s: %s has the methods of isolate.%s (%s) but does not assert it: add var _ isolate.%s = (*%s)(nil)", tier, typ, name, strings.Join(want, ", "), name, typ)
				}
			}
		}
	}
	return out
}

// TestAbilitiesDocumented: every tier asserts each ability it has, and
// docs/design.md's table of abilities says which tier has which, as the
// tiers' assertions do.
func TestAbilitiesDocumented(t *testing.T) {
	root, _ := moduleRoot(t)
	got := tierAbilities(t, root)
	optional := abilities(t, root)
	delete(optional, "Runtime")
	delete(optional, "Box")
	b, err := os.ReadFile(filepath.Join(root, "docs/design.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The table: a header "| ability | ... | TIER | TIER |", then a row per
	// ability: "| `Name` ... | yes | |".
	var cols []string
	doc := map[string]map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			cols = nil
			continue
		}
		if cells[0] == "ability" {
			cols = cells
			continue
		}
		if cols == nil || len(cells) != len(cols) {
			continue
		}
		name, _, ok := strings.Cut(strings.TrimPrefix(cells[0], "`"), "`")
		if !ok || !strings.HasPrefix(cells[0], "`") {
			continue
		}
		for i, c := range cols {
			if _, isTier := got[c]; !isTier {
				continue
			}
			if doc[c] == nil {
				doc[c] = map[string]bool{}
			}
			switch cells[i] {
			case "yes":
				doc[c][name] = true
			case "", "no":
			default:
				t.Errorf("design.md: ability %s, tier %s: %q (want yes or nothing)", name, c, cells[i])
			}
		}
		if _, ok := optional[name]; !ok {
			t.Errorf("design.md's table names %s, which is no ability of internal/isolate", name)
		}
		delete(optional, name)
	}
	if len(doc) == 0 {
		t.Fatal(`design.md has no table of abilities (a header row "| ability | ... | linux | gvisor | microvm |")`)
	}
	for name := range optional {
		t.Errorf("design.md's table of abilities lacks isolate.%s", name)
	}
	for _, tier := range slices.Sorted(maps.Keys(got)) {
		for _, name := range slices.Sorted(maps.Keys(got[tier])) {
			if !doc[tier][name] {
				t.Errorf("tier %s asserts isolate.%s; design.md's table does not say so", tier, name)
			}
		}
		for name := range doc[tier] {
			if !got[tier][name] {
				t.Errorf("design.md's table gives tier %s isolate.%s, which it does not assert", tier, name)
			}
		}
	}
}
