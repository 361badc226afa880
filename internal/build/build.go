// Package build parses the Dockerfiles of `den image build` and keys their
// steps for caching: Parse reads a single-stage Dockerfile into instructions
// with build arguments and Docker's variable substitution applied, Resolve,
// Sources and ContextDigest work out what a COPY or ADD takes from the build
// context (honouring .dockerignore and never leaving the context directory),
// and CacheKey combines a parent image, an instruction and its inputs into
// the key under which the result of the step can be reused.
package build

import (
	"fmt"
	"io"
	"path"
	"runtime"
	"sort"
	"strings"
)

// Instruction is one instruction of a Dockerfile, after parsing and
// substitution.
type Instruction struct {
	Line int    // 1-based line where the instruction starts
	Cmd  string // upper case: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL, EXPOSE, CMD, ENTRYPOINT

	// Args depends on Cmd:
	//   FROM: the image reference.
	//   RUN, CMD, ENTRYPOINT: the exec form's array, or, with Shell set, the
	//     one command string for the shell (not expanded: the shell does it).
	//   COPY, ADD: the sources then the destination.
	//   WORKDIR: the absolute directory, resolved against the previous one.
	//   USER: user[:group].
	//   EXPOSE: the ports, each "port/proto" with the protocol in lower case
	//     (tcp when none was given) and ranges expanded.
	//   ENV, LABEL, ARG: nil (see KV).
	Args  []string
	Shell bool // RUN/CMD/ENTRYPOINT given in shell form

	// KV holds the pairs of ENV and LABEL, and the names and defaults of
	// ARG (the default is "" when none was given; the value in effect is in
	// BuildArgs of the RUNs that follow), in order.
	KV [][2]string

	// Flags holds the --name=value options without their dashes: chown and
	// chmod of COPY and ADD, platform of FROM. Nil when there are none.
	Flags map[string]string

	// BuildArgs (RUN only) lists as "NAME=value", sorted, the build
	// arguments in effect that no ENV overrides, plus predefined proxy
	// arguments (HTTP_PROXY and friends) passed to Parse. They belong in the
	// command's environment on top of the image's, but not in the image.
	BuildArgs []string

	Raw string // the original text (continuations joined, comment lines removed)
}

// Dockerfile is a parsed single-stage Dockerfile.
type Dockerfile struct {
	// MetaArgs are the ARG instructions before FROM; their values are
	// visible to FROM only (and to a later ARG of the same name without a
	// default).
	MetaArgs []*Instruction
	// Instructions starts with the FROM.
	Instructions []*Instruction
	Base         string // the FROM image, after substitution
	Stage        string // the name given by FROM ... AS name, or ""
	Escape       rune   // '\\' or '`' (the escape parser directive)
	Syntax       string // the syntax parser directive, recorded and otherwise ignored
	// UnusedBuildArgs are the build arguments that no ARG declared
	// (predefined proxy arguments excepted), sorted; Docker warns of them.
	UnusedBuildArgs []string
}

// Error is a Dockerfile error at a line.
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("Dockerfile line %d: %s", e.Line, e.Msg) }

func errorf(line int, format string, a ...any) *Error {
	return &Error{Line: line, Msg: fmt.Sprintf(format, a...)}
}

// Options are the inputs of ParseWith.
type Options struct {
	// BuildArgs are the --build-arg values; they override ARG defaults.
	BuildArgs map[string]string
	// Base, if not nil, is called once with the FROM image (after
	// substitution; never for "scratch") and returns the image's configured
	// environment ("NAME=value") and working directory. Substitutions then
	// see the inherited variables (ENV PATH=/venv/bin:$PATH) and a relative
	// WORKDIR resolves against the image's. Without it the base image is
	// taken to have no environment and "/" as working directory. An error
	// it returns is reported at the FROM line.
	Base func(image string) (env []string, workdir string, err error)
}

// MaxSize is the largest Dockerfile Parse reads.
const MaxSize = 8 << 20

// Parse reads a single-stage Dockerfile and returns its instructions with
// the build arguments and Docker's substitution applied. Errors in the
// Dockerfile are *Error.
func Parse(r io.Reader, buildArgs map[string]string) (*Dockerfile, error) {
	return ParseWith(r, Options{BuildArgs: buildArgs})
}

// Supported lists the instructions Parse accepts, in the order its errors
// name them.
var Supported = []string{"FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT"}

// unsupported are the instructions Docker knows that den does not build.
var unsupported = map[string]bool{
	"VOLUME": true, "STOPSIGNAL": true, "HEALTHCHECK": true, "SHELL": true, "ONBUILD": true, "MAINTAINER": true,
}

// proxyArgs are Docker's predefined build arguments: usable without an ARG
// and kept out of cache keys.
var proxyArgs = map[string]bool{
	"HTTP_PROXY": true, "http_proxy": true, "HTTPS_PROXY": true, "https_proxy": true,
	"FTP_PROXY": true, "ftp_proxy": true, "NO_PROXY": true, "no_proxy": true,
	"ALL_PROXY": true, "all_proxy": true,
}

// platformArgs are the automatic platform arguments of the global scope.
func platformArgs() map[string]string {
	variant := ""
	if runtime.GOARCH == "arm" {
		variant = "v7"
	}
	p := "linux/" + runtime.GOARCH
	if variant != "" {
		p += "/" + variant
	}
	m := map[string]string{}
	for _, pre := range []string{"BUILD", "TARGET"} {
		m[pre+"PLATFORM"] = p
		m[pre+"OS"] = "linux"
		m[pre+"ARCH"] = runtime.GOARCH
		m[pre+"VARIANT"] = variant
	}
	return m
}

// ParseWith is Parse with Options.
func ParseWith(r io.Reader, opt Options) (*Dockerfile, error) {
	src, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading Dockerfile: %w", err)
	}
	if len(src) > MaxSize {
		return nil, fmt.Errorf("Dockerfile is larger than %d bytes", MaxSize)
	}
	lines, dirs, nlines, perr := splitLogical(string(src))
	if perr != nil {
		return nil, perr
	}
	p := &parser{
		opt:      opt,
		escape:   dirs.escape,
		meta:     platformArgs(),
		declared: map[string]bool{},
		env:      map[string]string{},
		args:     map[string]string{},
		workdir:  "/",
	}
	df := &Dockerfile{Escape: dirs.escape, Syntax: dirs.syntax}
	for _, l := range lines {
		ins, err := p.instruction(l)
		if err != nil {
			return nil, err
		}
		switch {
		case ins.Cmd == "FROM":
			df.Instructions = append(df.Instructions, ins)
			df.Base, df.Stage = ins.Args[0], p.stage
		case !p.seenFrom:
			df.MetaArgs = append(df.MetaArgs, ins)
		default:
			df.Instructions = append(df.Instructions, ins)
		}
	}
	if !p.seenFrom {
		return nil, errorf(max(1, nlines), "no FROM instruction: a Dockerfile must have a FROM (only ARG may come before it)")
	}
	for k := range opt.BuildArgs {
		if !p.declared[k] && !proxyArgs[k] {
			df.UnusedBuildArgs = append(df.UnusedBuildArgs, k)
		}
	}
	sort.Strings(df.UnusedBuildArgs)
	return df, nil
}

type parser struct {
	opt      Options
	escape   rune
	seenFrom bool
	stage    string
	meta     map[string]string // values of the global scope (before FROM)
	declared map[string]bool   // names declared by some ARG
	env      map[string]string // ENV in effect in the stage, base image's included
	args     map[string]string // ARG values in effect in the stage (set ones only)
	workdir  string
	ports    int // EXPOSE entries so far
}

// maxPorts bounds the EXPOSE entries of a Dockerfile (ranges expanded): every
// port of every protocol.
const maxPorts = 3 * 65535

func (p *parser) metaLookup(name string) (string, bool) {
	v, ok := p.meta[name]
	return v, ok
}

func (p *parser) stageLookup(name string) (string, bool) {
	if v, ok := p.env[name]; ok {
		return v, true
	}
	v, ok := p.args[name]
	return v, ok
}

// lexer returns the word processor for the instruction's scope.
func (p *parser) lexer(noQuotes bool) *lexer {
	lk := p.stageLookup
	if !p.seenFrom {
		lk = p.metaLookup
	}
	return &lexer{escape: p.escape, lookup: lk, noQuotes: noQuotes}
}

func supportedList() string { return strings.Join(Supported, ", ") }

func (p *parser) instruction(l logical) (*Instruction, error) {
	word, rest := cutSpace(l.text)
	cmd := strings.ToUpper(word)
	switch {
	case unsupported[cmd]:
		return nil, errorf(l.line, "%s is not supported (supported: %s)", cmd, supportedList())
	case !isSupported(cmd):
		return nil, errorf(l.line, "unknown instruction %q (supported: %s)", word, supportedList())
	case cmd != "FROM" && cmd != "ARG" && !p.seenFrom:
		return nil, errorf(l.line, "%s before FROM: a Dockerfile must begin with FROM (only ARG may come before it)", cmd)
	case cmd == "FROM" && p.seenFrom:
		return nil, errorf(l.line, "multi-stage builds are not supported yet")
	}
	ins := &Instruction{Line: l.line, Cmd: cmd, Raw: l.text}
	flags, rest, err := splitFlags(rest)
	if err != nil {
		return nil, errorf(l.line, "%s: %v", cmd, err)
	}
	if err := p.flags(ins, flags); err != nil {
		return nil, err
	}
	if rest == "" {
		switch cmd {
		case "COPY", "ADD":
			return nil, errorf(l.line, "%s requires at least two arguments: source(s) and destination", cmd)
		default:
			return nil, errorf(l.line, "%s requires an argument", cmd)
		}
	}
	switch cmd {
	case "FROM":
		err = p.from(ins, rest)
	case "RUN", "CMD", "ENTRYPOINT":
		err = p.exec(ins, rest)
	case "COPY", "ADD":
		err = p.copy(ins, rest)
	case "ENV", "LABEL":
		err = p.pairs(ins, rest)
	case "ARG":
		err = p.arg(ins, rest)
	case "WORKDIR":
		err = p.workdirIns(ins, rest)
	case "USER":
		err = p.user(ins, rest)
	case "EXPOSE":
		err = p.expose(ins, rest)
	}
	if err != nil {
		if e, ok := err.(*Error); ok {
			return nil, e
		}
		return nil, errorf(l.line, "%s: %v", cmd, err)
	}
	return ins, nil
}

func isSupported(cmd string) bool {
	for _, s := range Supported {
		if s == cmd {
			return true
		}
	}
	return false
}

// flagSpec says which flags an instruction takes: true for a string flag,
// false for one den does not support.
var flagSpec = map[string]map[string]bool{
	"FROM": {"platform": true},
	"COPY": {"chown": true, "chmod": true, "from": false, "link": false, "parents": false, "exclude": false},
	"ADD":  {"chown": true, "chmod": true, "link": false, "checksum": false, "keep-git-dir": false, "exclude": false, "unpack": false},
	"RUN":  {"mount": false, "network": false, "security": false, "device": false},
}

func (p *parser) flags(ins *Instruction, flags []flag) error {
	for _, f := range flags {
		ok, known := flagSpec[ins.Cmd][f.name]
		switch {
		case !known:
			return errorf(ins.Line, "unknown flag --%s for %s", f.name, ins.Cmd)
		case !ok && f.name == "from":
			return errorf(ins.Line, "COPY --from is not supported (multi-stage builds are not supported yet)")
		case !ok:
			return errorf(ins.Line, "%s --%s is not supported", ins.Cmd, f.name)
		case !f.hasValue:
			return errorf(ins.Line, "%s --%s needs a value (--%s=...)", ins.Cmd, f.name, f.name)
		}
		if _, dup := ins.Flags[f.name]; dup {
			return errorf(ins.Line, "%s: --%s given twice", ins.Cmd, f.name)
		}
		v, err := p.lexer(false).word(f.value)
		if err != nil {
			return errorf(ins.Line, "%s --%s: %v", ins.Cmd, f.name, err)
		}
		if v == "" {
			return errorf(ins.Line, "%s --%s is empty", ins.Cmd, f.name)
		}
		if f.name == "chmod" {
			if err := checkChmod(v); err != nil {
				return errorf(ins.Line, "%s --chmod=%s: %v", ins.Cmd, v, err)
			}
		}
		if ins.Flags == nil {
			ins.Flags = map[string]string{}
		}
		ins.Flags[f.name] = v
	}
	return nil
}

func checkChmod(v string) error {
	if len(v) > 5 {
		return fmt.Errorf("not an octal mode up to 7777")
	}
	for _, c := range v {
		if c < '0' || c > '7' {
			return fmt.Errorf("not an octal mode (symbolic modes are not supported)")
		}
	}
	var n int
	fmt.Sscanf(v, "%o", &n)
	if n > 0o7777 {
		return fmt.Errorf("not an octal mode up to 7777")
	}
	return nil
}

func (p *parser) from(ins *Instruction, rest string) error {
	words := fieldsASCII(rest)
	if len(words) != 1 && !(len(words) == 3 && strings.EqualFold(words[1], "AS")) {
		return errorf(ins.Line, "FROM takes an image, optionally followed by AS name")
	}
	image, err := p.lexer(false).word(words[0])
	if err != nil {
		return err
	}
	if image == "" || strings.IndexFunc(image, isASCIISpace) >= 0 {
		return errorf(ins.Line, "FROM image %q is not a valid image reference after substitution", image)
	}
	if len(words) == 3 {
		name := strings.ToLower(words[2])
		if !validStage(name) {
			return errorf(ins.Line, "invalid build stage name %q: must start with a letter and contain only letters, digits, '-', '_' and '.'", words[2])
		}
		p.stage = name
	}
	ins.Args = []string{image}
	p.seenFrom = true
	if p.opt.Base != nil && image != "scratch" {
		env, wd, err := p.opt.Base(image)
		if err != nil {
			return errorf(ins.Line, "base image %s: %v", image, err)
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			if k != "" {
				p.env[k] = v
			}
		}
		if wd != "" {
			p.workdir = path.Join("/", wd)
		}
	}
	return nil
}

func validStage(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func (p *parser) exec(ins *Instruction, rest string) error {
	if arr, isJSON, err := parseJSONArray(rest); err != nil {
		return errorf(ins.Line, "%s: %v", ins.Cmd, err)
	} else if isJSON {
		if len(arr) == 0 && ins.Cmd == "RUN" {
			return errorf(ins.Line, "RUN requires a command")
		}
		ins.Args = arr
	} else {
		if ins.Cmd == "RUN" {
			if h, ok := findHeredoc(rest, p.escape); ok {
				return errorf(ins.Line, "heredocs are not supported (%s)", h)
			}
		}
		ins.Args = []string{rest}
		ins.Shell = true
	}
	if ins.Cmd == "RUN" {
		ins.BuildArgs = p.runArgs()
	}
	return nil
}

// runArgs returns the build arguments a RUN sees in its environment.
func (p *parser) runArgs() []string {
	var out []string
	for k, v := range p.args {
		if _, shadowed := p.env[k]; !shadowed {
			out = append(out, k+"="+v)
		}
	}
	for k, v := range p.opt.BuildArgs {
		if proxyArgs[k] && !p.declared[k] {
			if _, shadowed := p.env[k]; !shadowed {
				out = append(out, k+"="+v)
			}
		}
	}
	sort.Strings(out)
	return out
}

func (p *parser) copy(ins *Instruction, rest string) error {
	var args []string
	if arr, isJSON, err := parseJSONArray(rest); err != nil {
		return err
	} else if isJSON {
		lx := p.lexer(true)
		for _, a := range arr {
			v, err := lx.word(a)
			if err != nil {
				return err
			}
			args = append(args, v)
		}
	} else {
		if h, ok := findHeredoc(rest, p.escape); ok {
			return errorf(ins.Line, "heredocs are not supported (%s)", h)
		}
		lx := p.lexer(false)
		for _, w := range fieldsASCII(rest) {
			v, err := lx.word(w)
			if err != nil {
				return err
			}
			args = append(args, v)
		}
	}
	if len(args) < 2 {
		return errorf(ins.Line, "%s requires at least two arguments: source(s) and destination", ins.Cmd)
	}
	for i, a := range args {
		if a == "" {
			what := "source"
			if i == len(args)-1 {
				what = "destination"
			}
			return errorf(ins.Line, "%s %s is empty after substitution", ins.Cmd, what)
		}
	}
	srcs, dest := args[:len(args)-1], args[len(args)-1]
	for _, s := range srcs {
		if isURL(s) {
			if ins.Cmd == "COPY" {
				return errorf(ins.Line, "COPY source %s is a URL: COPY takes files from the build context only", s)
			}
			return errorf(ins.Line, "ADD of a URL or git repository (%s) is not supported; download it in a RUN instead", s)
		}
	}
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return errorf(ins.Line, "%s with more than one source needs a destination directory ending in /", ins.Cmd)
	}
	ins.Args = args
	return nil
}

func isURL(s string) bool {
	l := strings.ToLower(s)
	for _, pre := range []string{"http://", "https://", "git://", "git@", "ssh://"} {
		if strings.HasPrefix(l, pre) {
			return true
		}
	}
	return false
}

// pairs parses ENV and LABEL: name=value pairs, or the legacy "name value".
func (p *parser) pairs(ins *Instruction, rest string) error {
	lx := p.lexer(false)
	words := rawWords(rest, p.escape)
	var raw [][2]string
	if !strings.Contains(words[0], "=") {
		k, v := cutSpace(rest)
		if v == "" {
			return errorf(ins.Line, "%s must have two arguments (name value) or be name=value pairs", ins.Cmd)
		}
		raw = append(raw, [2]string{k, v})
	} else {
		for _, w := range words {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return errorf(ins.Line, "%s: can't find = in %q; must be of the form name=value", ins.Cmd, w)
			}
			raw = append(raw, [2]string{k, v})
		}
	}
	for _, kv := range raw {
		k, err := lx.word(kv[0])
		if err != nil {
			return err
		}
		v, err := lx.word(kv[1])
		if err != nil {
			return err
		}
		if ins.Cmd == "ENV" {
			if err := checkName(k); err != nil {
				return errorf(ins.Line, "ENV: %v", err)
			}
		} else if k == "" {
			return errorf(ins.Line, "LABEL names can not be blank")
		}
		ins.KV = append(ins.KV, [2]string{k, v})
	}
	if ins.Cmd == "ENV" {
		// All of one ENV's substitutions see the environment before it.
		for _, kv := range ins.KV {
			p.env[kv[0]] = kv[1]
		}
	}
	return nil
}

func checkName(k string) error {
	if k == "" {
		return fmt.Errorf("names can not be blank")
	}
	if strings.ContainsAny(k, "=\x00") || strings.IndexFunc(k, isUnicodeSpace) >= 0 {
		return fmt.Errorf("invalid name %q", k)
	}
	return nil
}

func (p *parser) arg(ins *Instruction, rest string) error {
	lx := p.lexer(false)
	type decl struct {
		name, def  string
		hasDefault bool
	}
	var decls []decl
	for _, w := range rawWords(rest, p.escape) {
		k, v, hasDefault := strings.Cut(w, "=")
		name, err := lx.word(k)
		if err != nil {
			return err
		}
		if err := checkName(name); err != nil {
			return errorf(ins.Line, "ARG: %v", err)
		}
		def := ""
		if hasDefault {
			if def, err = lx.word(v); err != nil {
				return err
			}
		}
		decls = append(decls, decl{name, def, hasDefault})
		ins.KV = append(ins.KV, [2]string{name, def})
	}
	// Like ENV, all the defaults see the variables before the instruction.
	for _, d := range decls {
		p.declared[d.name] = true
		value, set := p.opt.BuildArgs[d.name]
		switch {
		case set:
		case d.hasDefault:
			value, set = d.def, true
		case p.seenFrom:
			// Redeclared without a default: keep the stage's value, or
			// take the global one.
			if value, set = p.args[d.name]; !set {
				value, set = p.meta[d.name]
			}
		default:
			value, set = p.meta[d.name]
		}
		scope := p.args
		if !p.seenFrom {
			scope = p.meta
		}
		if set {
			scope[d.name] = value
		}
	}
	return nil
}

func (p *parser) workdirIns(ins *Instruction, rest string) error {
	dir, err := p.lexer(false).word(rest)
	if err != nil {
		return err
	}
	if dir == "" {
		return errorf(ins.Line, "WORKDIR is empty after substitution")
	}
	p.workdir = path.Join(p.workdir, dir)
	if path.IsAbs(dir) {
		p.workdir = path.Clean(dir)
	}
	ins.Args = []string{p.workdir}
	return nil
}

func (p *parser) user(ins *Instruction, rest string) error {
	u, err := p.lexer(false).word(rest)
	if err != nil {
		return err
	}
	if u == "" {
		return errorf(ins.Line, "USER is empty after substitution")
	}
	ins.Args = []string{u}
	return nil
}

func (p *parser) expose(ins *Instruction, rest string) error {
	lx := p.lexer(false)
	seen := map[string]bool{}
	for _, w := range fieldsASCII(rest) {
		specs, err := lx.words(w)
		if err != nil {
			return err
		}
		for _, s := range specs {
			ports, err := parsePorts(s, maxPorts-p.ports)
			if err != nil {
				return errorf(ins.Line, "EXPOSE %s: %v", s, err)
			}
			p.ports += len(ports)
			for _, port := range ports {
				if !seen[port] {
					seen[port] = true
					ins.Args = append(ins.Args, port)
				}
			}
		}
	}
	if len(ins.Args) == 0 {
		return errorf(ins.Line, "EXPOSE has no ports after substitution")
	}
	return nil
}

// parsePorts expands "port[-port][/proto]" into at most limit entries.
func parsePorts(s string, limit int) ([]string, error) {
	spec, proto, hasProto := strings.Cut(s, "/")
	proto = strings.ToLower(proto)
	switch {
	case !hasProto:
		proto = "tcp"
	case proto != "tcp" && proto != "udp" && proto != "sctp":
		return nil, fmt.Errorf("protocol must be tcp, udp or sctp")
	}
	lo, hi, isRange := strings.Cut(spec, "-")
	if !isRange {
		hi = lo
	}
	first, err1 := portNumber(lo)
	last, err2 := portNumber(hi)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("want a port (1-65535) or a range of ports, optionally followed by /tcp, /udp or /sctp")
	}
	if first > last {
		return nil, fmt.Errorf("the range is empty")
	}
	if last-first+1 > limit {
		return nil, fmt.Errorf("too many ports: a Dockerfile may expose at most %d (ranges expanded)", maxPorts)
	}
	var out []string
	for n := first; n <= last; n++ {
		out = append(out, fmt.Sprintf("%d/%s", n, proto))
	}
	return out, nil
}

func portNumber(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, fmt.Errorf("bad port")
	}
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad port")
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("bad port")
	}
	return n, nil
}
