package api

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The OpenAPI document is written by hand; these tests tie it to docs/api.md
// (the route table) and to the Go wire types, so that neither can drift.

func openAPIDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("api/openapi.json is not JSON: %v", err)
	}
	return doc
}

func obj(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

var httpMethods = map[string]bool{
	"get": true, "put": true, "post": true, "delete": true,
	"options": true, "head": true, "patch": true, "trace": true,
}

// docRoute is one row of the route table in docs/api.md.
type docRoute struct {
	method, path string // "GET", "/v1/sandboxes/{id}" (query string stripped)
	body, answer string // the other two columns
	// anyMethod marks a row without a method whose second column is
	// "any" (the preview proxy): the document lists it as GET with
	// "x-any-method": true.
	anyMethod bool
}

// routeRow matches a route table row: the versioned routes, the few
// unversioned ones (GET /metrics) and those for any method, which have no
// method (/preview/...).
var routeRow = regexp.MustCompile("^\\|\\s*`(?:([A-Z]+) )?(/[^`]*)`\\s*\\|")

func docRoutes(t *testing.T) []docRoute {
	t.Helper()
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docRoute
	for _, line := range strings.Split(string(b), "\n") {
		m := routeRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		p, _, _ := strings.Cut(m[2], "?")
		cols := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cols) < 3 {
			t.Fatalf("docs/api.md: route row has %d columns: %s", len(cols), line)
		}
		r := docRoute{
			method: m[1], path: p,
			body:   strings.TrimSpace(cols[1]),
			answer: strings.TrimSpace(strings.Join(cols[2:], "|")),
		}
		if r.method == "" {
			// A route for any method: the second column says so, and
			// the route takes whatever body its method does.
			if r.body != "any" {
				t.Fatalf("docs/api.md: a route row without a method must say any in its second column: %s", line)
			}
			r.method, r.body, r.anyMethod = "GET", "", true
		}
		// A trailing /... (the rest of the path, slashes included) is
		// the path parameter {rest} in the document.
		if rest, ok := strings.CutSuffix(r.path, "/..."); ok {
			r.path = rest + "/{rest}"
		}
		if strings.Contains(r.path, "...") {
			t.Fatalf("docs/api.md: ... only at the end of a path: %s", line)
		}
		out = append(out, r)
	}
	if len(out) < 10 {
		t.Fatalf("docs/api.md: found only %d route rows; did the table format change?", len(out))
	}
	return out
}

func TestOpenAPIVersion(t *testing.T) {
	doc := openAPIDoc(t)
	if v, _ := doc["openapi"].(string); v != "3.1.0" {
		t.Errorf("openapi = %q, want 3.1.0", v)
	}
	info := obj(doc["info"])
	if info["title"] != "den" || info["version"] != "1" {
		t.Errorf("info = %v, want title den, version 1", info)
	}
	if obj(obj(obj(doc["components"])["securitySchemes"])["bearerAuth"]) == nil {
		t.Error("components.securitySchemes.bearerAuth is missing")
	}
}

func TestOpenAPIRoutesMatchDocs(t *testing.T) {
	doc := openAPIDoc(t)
	want := map[string]bool{}
	for _, r := range docRoutes(t) {
		k := r.method + " " + r.path
		if want[k] {
			t.Errorf("docs/api.md lists %s twice", k)
		}
		want[k] = true
	}
	got := map[string]bool{}
	for p, item := range obj(doc["paths"]) {
		for m := range obj(item) {
			if httpMethods[m] {
				got[strings.ToUpper(m)+" "+p] = true
			}
		}
	}
	for k := range want {
		if !got[k] {
			t.Errorf("route %s is in docs/api.md but not in api/openapi.json", k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("route %s is in api/openapi.json but not in docs/api.md", k)
		}
	}
	// A route for any method is one GET operation marked x-any-method,
	// alone on its path; no other operation carries the mark.
	anyRoute := map[string]bool{}
	for _, r := range docRoutes(t) {
		if r.anyMethod {
			anyRoute[r.method+" "+r.path] = true
			n := 0
			for m := range obj(obj(doc["paths"])[r.path]) {
				if httpMethods[m] {
					n++
				}
			}
			if n != 1 {
				t.Errorf("route %s (any method): the document has %d operations on the path, want only get", r.path, n)
			}
		}
	}
	for p, item := range obj(doc["paths"]) {
		for m, op := range obj(item) {
			if !httpMethods[m] {
				continue
			}
			k := strings.ToUpper(m) + " " + p
			if mark, ok := obj(op)["x-any-method"]; ok && (mark != true || !anyRoute[k]) {
				t.Errorf("%s: x-any-method %v, but docs/api.md lists the route for one method", k, mark)
			} else if !ok && anyRoute[k] {
				t.Errorf("%s: docs/api.md lists the route for any method; want x-any-method: true", k)
			}
		}
	}
}

// TestOpenAPIRouteDetails checks each documented route's status code, its
// JSON body and answer schema, and its path parameters. A route whose answer
// the docs describe as a WebSocket must answer 101, and the type the docs
// name is then that of its text messages, given in the operation's
// x-websocket extension.
func TestOpenAPIRouteDetails(t *testing.T) {
	doc := openAPIDoc(t)
	paths := obj(doc["paths"])
	typeName := regexp.MustCompile("`(\\[?)([A-Z][A-Za-z]*)(\\]?)`")
	status := regexp.MustCompile(`^([0-9]{3})\b`)
	pathParam := regexp.MustCompile(`\{([a-z]+)\}`)
	mediaType := regexp.MustCompile("`((?:application|text)/[a-z0-9.+-]+)`")
	for _, r := range docRoutes(t) {
		item := obj(paths[r.path])
		op := obj(item[strings.ToLower(r.method)])
		if op == nil {
			continue // reported by TestOpenAPIRoutesMatchDocs
		}
		name := r.method + " " + r.path
		code := "200"
		if m := status.FindStringSubmatch(r.answer); m != nil {
			code = m[1]
		}
		websocket := strings.HasPrefix(r.answer, "WebSocket")
		if websocket {
			code = "101"
		}
		resps := obj(op["responses"])
		if resps[code] == nil {
			t.Errorf("%s: docs say %s, the document has no %s response", name, code, code)
		}
		for c := range resps {
			if n, err := strconv.Atoi(c); err == nil && n >= 200 && n < 300 && c != code {
				t.Errorf("%s: document has success response %s, docs say %s", name, c, code)
			}
		}
		if websocket {
			ws := obj(op["x-websocket"])
			if ws == nil {
				t.Errorf("%s: a WebSocket route without an x-websocket extension", name)
			} else if n, _ := ws["maxMessageBytes"].(float64); n != MaxTTYMessage {
				t.Errorf("%s: x-websocket.maxMessageBytes = %v, want %d", name, ws["maxMessageBytes"], MaxTTYMessage)
			}
			if m := typeName.FindStringSubmatch(r.answer); m != nil {
				checkSchemaRef(t, name+" text messages", obj(ws["text"]), m[2], m[1] == "[")
			}
			if c := obj(resps[code])["content"]; c != nil {
				t.Errorf("%s: the 101 answer has content %v; its messages belong in x-websocket", name, keys(obj(c)))
			}
		} else if m := typeName.FindStringSubmatch(r.answer); m != nil {
			s := obj(obj(obj(obj(resps[code])["content"])["application/json"])["schema"])
			checkSchemaRef(t, name+" answer", s, m[2], m[1] == "[")
		}
		// Answers that are not JSON: a media type the docs name, and
		// Prometheus text.
		content := obj(obj(resps[code])["content"])
		for _, m := range mediaType.FindAllStringSubmatch(r.answer, -1) {
			if content[m[1]] == nil {
				t.Errorf("%s: docs name %s, the %s answer has %v", name, m[1], code, keys(content))
			}
		}
		if strings.HasPrefix(r.answer, "Prometheus text") {
			ok := false
			for ct := range content {
				ok = ok || strings.HasPrefix(ct, "text/plain")
			}
			if !ok || content["application/json"] != nil {
				t.Errorf("%s: docs say Prometheus text, the %s answer has %v", name, code, keys(content))
			}
		}
		if m := typeName.FindStringSubmatch(r.body); m != nil {
			s := obj(obj(obj(obj(op["requestBody"])["content"])["application/json"])["schema"])
			checkSchemaRef(t, name+" body", s, m[2], m[1] == "[")
		} else if r.body == "" && op["requestBody"] != nil {
			t.Errorf("%s: docs list no body, the document has one", name)
		}
		// Every {param} in the path is declared as a required path parameter.
		declared := map[string]bool{}
		for _, params := range []any{item["parameters"], op["parameters"]} {
			for _, p := range asList(params) {
				p = resolve(t, doc, p)
				if obj(p)["in"] == "path" {
					declared[fmt.Sprint(obj(p)["name"])] = obj(p)["required"] == true
				}
			}
		}
		var inPath []string
		for _, m := range pathParam.FindAllStringSubmatch(r.path, -1) {
			inPath = append(inPath, m[1])
			if !declared[m[1]] {
				t.Errorf("%s: path parameter %s is not declared as a required path parameter", name, m[1])
			}
		}
		if len(declared) != len(inPath) {
			t.Errorf("%s: path parameters %v declared, path has %v", name, keys(declared), inPath)
		}
	}
}

func checkSchemaRef(t *testing.T, where string, s map[string]any, name string, array bool) {
	t.Helper()
	if array {
		if s["type"] != "array" {
			t.Errorf("%s: want an array of %s, got %v", where, name, s)
			return
		}
		s = obj(s["items"])
	}
	if want := "#/components/schemas/" + name; s["$ref"] != want {
		t.Errorf("%s: schema is %v, want $ref %s", where, s, want)
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

// resolve follows v's $ref, if it has one, within doc.
func resolve(t *testing.T, doc map[string]any, v any) any {
	t.Helper()
	ref, ok := obj(v)["$ref"].(string)
	if !ok {
		return v
	}
	got, err := pointer(doc, ref)
	if err != nil {
		t.Errorf("$ref %s: %v", ref, err)
	}
	return got
}

// pointer resolves a local reference "#/a/b~1c".
func pointer(doc any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("not a local reference")
	}
	cur := doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[tok]
			if !ok {
				return nil, fmt.Errorf("no %q", tok)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("bad index %q", tok)
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("cannot index %T with %q", cur, tok)
		}
	}
	return cur, nil
}

func TestOpenAPIRefsResolve(t *testing.T) {
	doc := openAPIDoc(t)
	n := 0
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"]; ok {
				n++
				s, ok := ref.(string)
				if !ok {
					t.Errorf("%s: $ref is %T, not a string", where, ref)
				} else if _, err := pointer(doc, s); err != nil {
					t.Errorf("%s: $ref %s does not resolve: %v", where, s, err)
				}
			}
			for k, e := range v {
				walk(where+"/"+k, e)
			}
		case []any:
			for i, e := range v {
				walk(where+"/"+strconv.Itoa(i), e)
			}
		}
	}
	walk("#", doc)
	if n == 0 {
		t.Error("no $ref found at all")
	}
}

// jsonNames returns the JSON field names of a struct type, with embedded
// structs flattened the way encoding/json does.
func jsonNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			out = append(out, jsonNames(ft)...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// schemaProps returns the property names of a schema, following $ref and
// allOf (the form an embedded struct takes).
func schemaProps(t *testing.T, doc map[string]any, s map[string]any, seen map[string]bool) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if ref, ok := s["$ref"].(string); ok {
		if seen[ref] {
			t.Fatalf("$ref cycle at %s", ref)
		}
		seen[ref] = true
		v, err := pointer(doc, ref)
		if err != nil {
			t.Fatalf("$ref %s: %v", ref, err)
		}
		for k := range schemaProps(t, doc, obj(v), seen) {
			out[k] = true
		}
	}
	for k := range obj(s["properties"]) {
		out[k] = true
	}
	for _, sub := range asList(s["allOf"]) {
		for k := range schemaProps(t, doc, obj(sub), seen) {
			out[k] = true
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestOpenAPISchemasMatchGoTypes(t *testing.T) {
	doc := openAPIDoc(t)
	schemas := obj(obj(doc["components"])["schemas"])
	types := map[string]any{
		"CreateRequest":   CreateRequest{},
		"ExecRequest":     ExecRequest{},
		"Sandbox":         Sandbox{},
		"Limits":          Limits{},
		"NetworkPolicy":   NetworkPolicy{},
		"SecretHeader":    SecretHeader{},
		"ExitStatus":      ExitStatus{},
		"ExecResult":      ExecResult{},
		"FileInfo":        FileInfo{},
		"MkdirRequest":    MkdirRequest{},
		"RenameRequest":   RenameRequest{},
		"Image":           Image{},
		"ImageConfig":     ImageConfig{},
		"Event":           Event{},
		"VersionInfo":     VersionInfo{},
		"Error":           Error{},
		"ErrorDoc":        ErrorDoc{},
		"Process":         Process{},
		"DroppedOutput":   DroppedOutput{},
		"ProcessInfo":     ProcessInfo{},
		"SignalRequest":   SignalRequest{},
		"Usage":           Usage{},
		"Stats":           Stats{},
		"Session":         Session{},
		"TTYControl":      TTYControl{},
		"WindowSize":      WindowSize{},
		"PullRequest":     PullRequest{},
		"CommitRequest":   CommitRequest{},
		"Snapshot":        Snapshot{},
		"SnapshotRequest": SnapshotRequest{},
		"RestoreRequest":  RestoreRequest{},
		"ForkRequest":     ForkRequest{},
		"VolumeMount":     VolumeMount{},
		"BindMount":       BindMount{},
		"Volume":          Volume{},
		"VolumeRequest":   VolumeRequest{},
		"PortRequest":     PortRequest{},
		"Preview":         Preview{},
		"Token":           Token{},
		"SSHKey":          SSHKey{},
		"SSHKeyRequest":   SSHKeyRequest{},
		"TokenRequest":    TokenRequest{},
		"GitSource":       GitSource{},
		"Diff":            Diff{},
		"DiffCommit":      DiffCommit{},
		"DiffFile":        DiffFile{},
		"ExportRequest":   ExportRequest{},
		"ExportResult":    ExportResult{},
		"GlobResult":      GlobResult{},
		"GrepMatch":       GrepMatch{},
		"GrepResult":      GrepResult{},
		// The prune answer has no type in this package; pruneResult
		// mirrors the daemon's.
		"PruneResult": pruneResult{},
	}
	for name, v := range types {
		s := obj(schemas[name])
		if s == nil {
			t.Errorf("components.schemas.%s is missing", name)
			continue
		}
		want := map[string]bool{}
		for _, n := range jsonNames(reflect.TypeOf(v)) {
			want[n] = true
		}
		got := schemaProps(t, doc, s, map[string]bool{})
		for n := range want {
			if !got[n] {
				t.Errorf("schema %s lacks property %q of the Go type", name, n)
			}
		}
		for n := range got {
			if !want[n] {
				t.Errorf("schema %s has property %q that the Go type lacks", name, n)
			}
		}
	}

	// The server rejects unknown fields in request bodies.
	for _, name := range []string{"CreateRequest", "ExecRequest", "MkdirRequest", "RenameRequest", "SignalRequest", "Limits", "NetworkPolicy", "SecretHeader", "PullRequest", "CommitRequest", "PortRequest", "SSHKeyRequest", "GitSource", "ExportRequest"} {
		if obj(schemas[name])["additionalProperties"] != false {
			t.Errorf("request schema %s: want additionalProperties: false", name)
		}
	}
}

// pruneResult is the answer of POST /v1/images/prune.
type pruneResult struct {
	Images []string `json:"images"`
	Layers int      `json:"layers"`
}

func TestOpenAPIErrorKinds(t *testing.T) {
	doc := openAPIDoc(t)
	comp := obj(doc["components"])
	kinds := []string{KindInvalid, KindUnauthorized, KindNotFound, KindExists, KindConflict, KindTooLarge, KindBusy, KindUnsupported, KindInternal}
	var got []string
	for _, k := range asList(obj(obj(obj(obj(comp["schemas"])["Error"])["properties"])["kind"])["enum"]) {
		got = append(got, fmt.Sprint(k))
	}
	sort.Strings(got)
	sort.Strings(kinds)
	if !reflect.DeepEqual(got, kinds) {
		t.Errorf("Error.kind enum = %v, want %v", got, kinds)
	}
	// Every error response is an ErrorDoc and sits under the status its
	// kind maps to.
	for code, resp := range walkResponses(doc) {
		n, _ := strconv.Atoi(code[:3])
		if n < 400 {
			continue
		}
		r := obj(resolve(t, doc, resp))
		s := obj(obj(obj(r["content"])["application/json"])["schema"])
		if s["$ref"] != "#/components/schemas/ErrorDoc" {
			t.Errorf("%s: error response schema is %v, want ErrorDoc", code, s)
		}
		if ex := obj(obj(obj(obj(r["content"])["application/json"])["example"])["error"]); ex != nil {
			if k := fmt.Sprint(ex["kind"]); HTTPStatus(k) != n {
				t.Errorf("%s: example kind %s maps to status %d", code, k, HTTPStatus(k))
			}
		}
	}
}

// walkResponses returns every operation response, keyed "STATUS METHOD PATH".
func walkResponses(doc map[string]any) map[string]any {
	out := map[string]any{}
	for p, item := range obj(doc["paths"]) {
		for m, op := range obj(item) {
			if !httpMethods[m] {
				continue
			}
			for code, r := range obj(obj(op)["responses"]) {
				out[code+" "+strings.ToUpper(m)+" "+p] = r
			}
		}
	}
	return out
}

func TestOpenAPIExecForms(t *testing.T) {
	doc := openAPIDoc(t)
	op := obj(obj(obj(doc["paths"])["/v1/sandboxes/{id}/exec"])["post"])
	content := obj(obj(obj(op["responses"])["200"])["content"])
	if content["application/json"] == nil || content[StreamContentType] == nil {
		t.Errorf("exec 200 answer: want application/json and %s forms, got %v", StreamContentType, keys(content))
	}
}

// TestOpenAPIImageStreams checks that pull and build answer JSON or, with
// Accept: application/x-ndjson, a stream of lines ending with the image or
// an error document.
func TestOpenAPIImageStreams(t *testing.T) {
	doc := openAPIDoc(t)
	for p, line := range map[string]string{"/v1/images/pull": "PullLine", "/v1/images/build": "BuildLine", "/v1/images/import": "ImportLine"} {
		op := obj(obj(obj(doc["paths"])[p])["post"])
		content := obj(obj(obj(op["responses"])["200"])["content"])
		if content["application/json"] == nil || content["application/x-ndjson"] == nil {
			t.Errorf("%s 200 answer: want application/json and application/x-ndjson forms, got %v", p, keys(content))
			continue
		}
		checkSchemaRef(t, p+" ndjson answer", obj(obj(content["application/x-ndjson"])["schema"]), line, false)
		var forms []string
		for _, s := range asList(obj(obj(obj(doc["components"])["schemas"])[line])["oneOf"]) {
			forms = append(forms, fmt.Sprint(obj(s)["$ref"]))
		}
		if len(forms) == 0 || forms[len(forms)-1] != "#/components/schemas/ErrorDoc" {
			t.Errorf("%s: the lines %v do not end with the ErrorDoc form", line, forms)
		}
	}
	build := obj(obj(obj(doc["paths"])["/v1/images/build"])["post"])
	if obj(build["requestBody"])["required"] != false {
		t.Error("build: the body must be optional (?debian takes none)")
	}
	if obj(obj(obj(build["requestBody"])["content"])["application/x-tar"]) == nil {
		t.Error("build: the body is a tar of the build context")
	}
}

func TestOpenAPINetworkModes(t *testing.T) {
	doc := openAPIDoc(t)
	np := obj(obj(obj(doc["components"])["schemas"])["NetworkPolicy"])
	var got []string
	for _, m := range asList(obj(obj(np["properties"])["mode"])["enum"]) {
		got = append(got, fmt.Sprint(m))
	}
	sort.Strings(got)
	want := []string{NetAllow, NetNone, NetOpen}
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NetworkPolicy.mode enum = %v, want %v", got, want)
	}
}

// TestOpenAPISecrets checks the secret store's routes (raw bytes in, names
// out) and the policy fields that use it.
func TestOpenAPISecrets(t *testing.T) {
	doc := openAPIDoc(t)
	paths := obj(doc["paths"])
	put := obj(obj(paths["/v1/secrets/{name}"])["put"])
	if obj(obj(obj(put["requestBody"])["content"])["application/octet-stream"]) == nil || obj(put["requestBody"])["required"] != true {
		t.Errorf("PUT /v1/secrets/{name}: want a required application/octet-stream body, got %v", put["requestBody"])
	}
	list := obj(obj(obj(obj(obj(obj(paths["/v1/secrets"])["get"])["responses"])["200"])["content"])["application/json"])
	if s := obj(list["schema"]); s["type"] != "array" || obj(s["items"])["type"] != "string" {
		t.Errorf("GET /v1/secrets: want an array of strings, got %v", list["schema"])
	}
	props := obj(obj(obj(obj(doc["components"])["schemas"])["NetworkPolicy"])["properties"])
	checkSchemaRef(t, "NetworkPolicy.secret_headers", obj(props["secret_headers"]), "SecretHeader", true)
	for _, p := range []string{"max_egress", "bandwidth"} {
		checkSchemaRef(t, "NetworkPolicy."+p, obj(props[p]), "Size", false)
	}
	if obj(props["conn_rate"])["type"] != "number" {
		t.Errorf("NetworkPolicy.conn_rate: want a number, got %v", props["conn_rate"])
	}
}

// unsupportedOps are the operations that can answer unsupported (422),
// each with the code that refuses: a tier or host feature this daemon may
// lack. TestOpenAPIErrorStatuses holds the document to exactly this list.
var unsupportedOps = map[string]string{
	"POST /v1/sandboxes":                      "Manager.Create: tierByName, networking off, disk quota without btrfs; git clone",
	"POST /v1/sandboxes/{id}/start":           "Manager.boot: the sandbox's tier is not available",
	"POST /v1/sandboxes/{id}/exec":            "agent handleLimits: the tier enforces its pids limit outside the agent",
	"POST /v1/sandboxes/{id}/processes":       "agent handleLimits, as exec",
	"PUT /v1/sandboxes/{id}/network":          "Manager.SetNetwork: networking off, or the tier cannot change it live",
	"GET /v1/sandboxes/{id}/ports/{port}/tcp": "Manager.DialPort: networking off",
	"GET /v1/sandboxes/{id}/stats":            "Manager.Stats: the tier reports no usage",
	"POST /v1/sandboxes/{id}/pause":           "Manager.Pause: the tier cannot pause",
	"POST /v1/sandboxes/{id}/resume":          "Manager.resumeLocked: the tier of a hibernated sandbox is not available",
	"POST /v1/sandboxes/{id}/hibernate":       "Manager.checkpointer: the tier cannot keep memory",
	"POST /v1/sandboxes/{id}/escalate":        "Manager.Escalate: tierByName",
	"POST /v1/sandboxes/{id}/snapshots":       "Manager.Snapshot: checkpointer (memory), frozen",
	"POST /v1/sandboxes/{id}/restore":         "Manager.Restore: checkpointer (memory), boot",
	"POST /v1/sandboxes/{id}/fork":            "Manager.Fork: checkpointer (memory), frozen, quota",
	"GET /v1/sandboxes/{id}/diff":             "Server.snapshot: Manager.frozen",
	"POST /v1/sandboxes/{id}/export":          "Server.snapshot: Manager.frozen",
	"POST /v1/sandboxes/{id}/commit":          "Server.snapshot: Manager.frozen",
	"POST /v1/volumes":                        "Manager.CreateVolume: a size without btrfs quotas",
	"POST /v1/images/import":                  "Manager.ImportImage: quotas",
	"POST /v1/images/build":                   "Manager.Build: mmdebstrap missing",
	"GET /v1/images/save":                     "Manager.SaveImages: the host image",
	"GET /v1/snapshots/{id}/archive":          "Manager.SnapshotArchive: the host image",
	"POST /v1/snapshots/load":                 "Manager.LoadSnapshot: quota without btrfs",
}

// TestOpenAPIErrorStatuses checks that each operation lists every error
// status the server's shared machinery can give it (schemathesis's
// status_code_conformance fails on any other):
//   - 401 (the bearer token) and 500 everywhere but the preview proxy and
//     /mcp, which check their own tokens;
//   - 400 where the request has a body, a query parameter (but ?sandbox=,
//     a lookup) or an image name (malformed values);
//   - 400, 413 and 429 where it has a JSON body (decoding, size, the
//     per-caller budget);
//   - 404 and 409 on a sandbox's routes (no such sandbox; stopped, or
//     stopped while the request ran);
//   - 400 and 404 on /mcp (no or an unknown session);
//   - 422 exactly on unsupportedOps.
func TestOpenAPIErrorStatuses(t *testing.T) {
	doc := openAPIDoc(t)
	seen := map[string]bool{}
	for p, item := range obj(doc["paths"]) {
		for m, op := range obj(item) {
			if !httpMethods[m] {
				continue
			}
			k := strings.ToUpper(m) + " " + p
			resps := obj(obj(op)["responses"])
			var want []string
			own := strings.HasPrefix(p, "/preview/") || p == "/mcp"
			if !own {
				want = append(want, "401", "500")
			}
			if p == "/mcp" {
				// The transport's own refusals (no or an unknown
				// Mcp-Session-Id), as error documents (server.Mount).
				want = append(want, "400", "404")
			}
			// Query parameters are parsed and checked; path parameters
			// and ?sandbox= are looked up as given (404 if no such
			// thing), except image names, which are parsed.
			params := 0
			for _, pr := range append(asList(obj(item)["parameters"]), asList(obj(op)["parameters"])...) {
				pr = resolve(t, doc, pr)
				in, name := obj(pr)["in"], obj(pr)["name"]
				if (in == "query" && name != "sandbox") || (in == "path" && strings.HasPrefix(p, "/v1/images/")) {
					params++
				}
			}
			body := obj(obj(op)["requestBody"])
			if params > 0 || body != nil {
				want = append(want, "400")
			}
			if obj(body["content"])["application/json"] != nil {
				want = append(want, "413", "429")
			}
			if strings.HasPrefix(p, "/v1/sandboxes/{id}") {
				want = append(want, "404", "409")
			}
			if _, ok := unsupportedOps[k]; ok {
				seen[k] = true
				want = append(want, "422")
			} else if resps["422"] != nil {
				t.Errorf("%s: documents 422 unsupported, but is not in unsupportedOps (add it with the code that refuses)", k)
			}
			for _, code := range want {
				if resps[code] == nil {
					t.Errorf("%s: no %s response", k, code)
				}
			}
		}
	}
	for k := range unsupportedOps {
		if !seen[k] {
			t.Errorf("unsupportedOps lists %s, which the document does not have", k)
		}
	}
}
