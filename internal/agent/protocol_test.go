package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
)

// recorder adds routes to a real mux and remembers their patterns.
type recorder struct {
	mux      *http.ServeMux
	patterns []string
}

func (r *recorder) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	r.patterns = append(r.patterns, pattern)
	r.mux.HandleFunc(pattern, h)
}

// protocolConsts are the string constants protocol.go declares, by name.
func protocolConsts(t *testing.T) map[string]string {
	f, err := parser.ParseFile(token.NewFileSet(), "protocol.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("protocol.go: %s is not a string literal", n.Name)
				}
				consts[n.Name], _ = strconv.Unquote(lit.Value)
			}
		}
	}
	return consts
}

// Every route the agent serves is named by protocol.go's paths, and every
// path there is served: the agent's real mux, probed with each request of
// the protocol, answers each with a route of its own, and no route is left
// that no request reaches.
func TestProtocolNamesEveryRoute(t *testing.T) {
	rec := &recorder{mux: http.NewServeMux()}
	(&Agent{}).routes(rec)
	requests := []struct{ method, path string }{
		{"GET", PathHealth},
		{"POST", PathExec},
		{"GET", PathFiles}, {"PUT", PathFiles}, {"DELETE", PathFiles},
		{"GET", PathList},
		{"GET", PathStat},
		{"POST", PathMkdir},
		{"POST", PathRename},
		{"GET", PathGlob},
		{"GET", PathGrep},
		{"GET", PathArchive}, {"PUT", PathArchive},
		{"POST", PathHostname},
		{"POST", PathLimits},
		{"GET", PathSessions}, {"DELETE", SessionPath("s1")},
		{"POST", PathProcs}, {"GET", PathProcs},
		{"GET", ProcPath("p1", "")},
		{"GET", ProcPath("p1", ProcOutput)},
		{"POST", ProcPath("p1", ProcSignal)},
		{"POST", ProcPath("p1", ProcStdin)},
		{"GET", ProcPath("p1", ProcWait)},
		{"GET", ProcPath("p1", ProcTTY)},
		{"GET", PathDial},
		{"POST", PathSync},
		{"POST", PathStop},
	}
	// The list above uses every constant of protocol.go.
	used := map[string]bool{}
	for _, r := range requests {
		used[r.path] = true
	}
	for name, v := range protocolConsts(t) {
		if !used[v] && !used[ProcPath("p1", v)] {
			t.Errorf("protocol.go's %s (%q) is in no request of this test", name, v)
		}
	}
	hit := map[string]bool{}
	for _, r := range requests {
		_, pattern := rec.mux.Handler(httptest.NewRequest(r.method, "http://agent"+r.path, nil))
		if !slices.Contains(rec.patterns, pattern) {
			t.Errorf("%s %s: the agent serves no route for it (matched %q)", r.method, r.path, pattern)
			continue
		}
		if hit[pattern] {
			t.Errorf("%s %s: matched %q, which another request of the protocol matched too", r.method, r.path, pattern)
		}
		hit[pattern] = true
	}
	for _, p := range rec.patterns {
		if !hit[p] {
			t.Errorf("the agent serves %q, which no path of protocol.go names", p)
		}
	}
	// A request outside the protocol finds no route (the probe can fail).
	if _, pattern := rec.mux.Handler(httptest.NewRequest("GET", "http://agent/files/lost", nil)); pattern != "" {
		t.Errorf("GET /files/lost matched %q", pattern)
	}
}
