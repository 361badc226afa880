package build

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

const pythonApp = `# syntax=docker/dockerfile:1
# A small web API.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS app
ARG PYTHON_VERSION
LABEL org.opencontainers.image.title="demo api" \
      org.opencontainers.image.version=$PYTHON_VERSION

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    APP_HOME=/srv/app
ARG PIP_INDEX_URL=https://pypi.org/simple
WORKDIR $APP_HOME

RUN apt-get update \
    # compilers for the wheels without binaries
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
COPY requirements.txt ./
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r requirements.txt
RUN useradd --create-home --uid 1000 app
COPY --chown=app:app --chmod=0644 src/ ./src/
USER app
EXPOSE 8000
ENTRYPOINT ["python", "-m", "app"]
CMD ["--port", "8000"]
`

func TestParsePythonApp(t *testing.T) {
	df := mustParse(t, pythonApp, map[string]string{"PIP_INDEX_URL": "https://mirror.example/simple", "HTTPS_PROXY": "http://proxy:3128"})
	pipArgs := []string{"HTTPS_PROXY=http://proxy:3128", "PIP_INDEX_URL=https://mirror.example/simple", "PYTHON_VERSION=3.12"}
	want := []*Instruction{
		{Line: 5, Cmd: "FROM", Args: []string{"python:3.12-slim"}, Raw: "FROM python:${PYTHON_VERSION}-slim AS app"},
		{Line: 6, Cmd: "ARG", KV: [][2]string{{"PYTHON_VERSION", ""}}, Raw: "ARG PYTHON_VERSION"},
		{Line: 7, Cmd: "LABEL", KV: [][2]string{{"org.opencontainers.image.title", "demo api"}, {"org.opencontainers.image.version", "3.12"}},
			Raw: `LABEL org.opencontainers.image.title="demo api"       org.opencontainers.image.version=$PYTHON_VERSION`},
		{Line: 10, Cmd: "ENV", KV: [][2]string{{"PYTHONDONTWRITEBYTECODE", "1"}, {"PYTHONUNBUFFERED", "1"}, {"APP_HOME", "/srv/app"}},
			Raw: "ENV PYTHONDONTWRITEBYTECODE=1     PYTHONUNBUFFERED=1     APP_HOME=/srv/app"},
		{Line: 13, Cmd: "ARG", KV: [][2]string{{"PIP_INDEX_URL", "https://pypi.org/simple"}}, Raw: "ARG PIP_INDEX_URL=https://pypi.org/simple"},
		{Line: 14, Cmd: "WORKDIR", Args: []string{"/srv/app"}, Raw: "WORKDIR $APP_HOME"},
		{Line: 16, Cmd: "RUN", Shell: true, BuildArgs: pipArgs,
			Args: []string{"apt-get update  && apt-get install -y --no-install-recommends build-essential  && rm -rf /var/lib/apt/lists/*"},
			Raw:  "RUN apt-get update  && apt-get install -y --no-install-recommends build-essential  && rm -rf /var/lib/apt/lists/*"},
		{Line: 20, Cmd: "COPY", Args: []string{"requirements.txt", "./"}, Raw: "COPY requirements.txt ./"},
		{Line: 21, Cmd: "RUN", Shell: true, BuildArgs: pipArgs,
			Args: []string{`pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r requirements.txt`},
			Raw:  `RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r requirements.txt`},
		{Line: 22, Cmd: "RUN", Shell: true, BuildArgs: pipArgs, Args: []string{"useradd --create-home --uid 1000 app"}, Raw: "RUN useradd --create-home --uid 1000 app"},
		{Line: 23, Cmd: "COPY", Args: []string{"src/", "./src/"}, Flags: map[string]string{"chown": "app:app", "chmod": "0644"},
			Raw: "COPY --chown=app:app --chmod=0644 src/ ./src/"},
		{Line: 24, Cmd: "USER", Args: []string{"app"}, Raw: "USER app"},
		{Line: 25, Cmd: "EXPOSE", Args: []string{"8000/tcp"}, Raw: "EXPOSE 8000"},
		{Line: 26, Cmd: "ENTRYPOINT", Args: []string{"python", "-m", "app"}, Raw: `ENTRYPOINT ["python", "-m", "app"]`},
		{Line: 27, Cmd: "CMD", Args: []string{"--port", "8000"}, Raw: `CMD ["--port", "8000"]`},
	}
	if !reflect.DeepEqual(df.Instructions, want) {
		diffLines(t, "instructions", renderAll(df.Instructions), renderAll(want))
		for i := range min(len(want), len(df.Instructions)) {
			if !reflect.DeepEqual(df.Instructions[i], want[i]) {
				t.Errorf("instruction %d:\n got %#v\nwant %#v", i, df.Instructions[i], want[i])
			}
		}
	}
	wantMeta := []*Instruction{{Line: 3, Cmd: "ARG", KV: [][2]string{{"PYTHON_VERSION", "3.12"}}, Raw: "ARG PYTHON_VERSION=3.12"}}
	if !reflect.DeepEqual(df.MetaArgs, wantMeta) {
		t.Errorf("MetaArgs = %v, want %v", renderAll(df.MetaArgs), renderAll(wantMeta))
	}
	if df.Base != "python:3.12-slim" || df.Stage != "app" || df.Escape != '\\' || df.Syntax != "docker/dockerfile:1" || df.UnusedBuildArgs != nil {
		t.Errorf("Base %q Stage %q Escape %q Syntax %q Unused %q", df.Base, df.Stage, df.Escape, df.Syntax, df.UnusedBuildArgs)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		args map[string]string
		want []string // rendered df.Instructions
	}{
		{
			name: "comments blank lines and indentation",
			src:  "# comment\n\n   # indented comment\nFROM alpine\n\n\t  RUN  echo hi   \n# RUN not this\n",
			want: []string{`4 FROM ["alpine"]`, `6 RUN ["echo hi"] shell`},
		},
		{
			name: "case-insensitive instruction names",
			src:  "from alpine\nrun true\nCoPy a /b\nworkDir /x\n",
			want: []string{`1 FROM ["alpine"]`, `2 RUN ["true"] shell`, `3 COPY ["a" "/b"]`, `4 WORKDIR ["/x"]`},
		},
		{
			name: "continuations skip comment and empty lines",
			src:  "FROM alpine\nRUN a \\\n  # inside\n\n  b \\   \n  c\nRUN d\n",
			want: []string{`1 FROM ["alpine"]`, `2 RUN ["a   b   c"] shell`, `7 RUN ["d"] shell`},
		},
		{
			name: "continuation at end of file",
			src:  "FROM alpine\nRUN a \\",
			want: []string{`1 FROM ["alpine"]`, `2 RUN ["a"] shell`},
		},
		{
			name: "CRLF line endings and BOM",
			src:  "\uFEFFFROM alpine\r\nENV A=1 \\\r\n  B=2\r\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["A=1" "B=2"]`},
		},
		{
			name: "escape directive",
			src:  "# escape=`\nFROM alpine\nRUN echo a `\n  b\nWORKDIR C:\\dir\nENV X=`$HOME Y=a\\b\n",
			want: []string{`2 FROM ["alpine"]`, `3 RUN ["echo a   b"] shell`, `5 WORKDIR ["/C:\\dir"]`, `6 ENV kv["X=$HOME" "Y=a\\b"]`},
		},
		{
			name: "directives end at the first other line",
			src:  "# hello\n# escape=`\nFROM alpine\nRUN a `\n",
			want: []string{`3 FROM ["alpine"]`, "4 RUN [\"a `\"] shell"},
		},
		{
			name: "directives with spaces and unknown directive",
			src:  "#  ESCAPE = `  \n# unknown=1\n# syntax=x\nFROM alpine\nRUN a `\n b\n",
			want: []string{`4 FROM ["alpine"]`, `5 RUN ["a  b"] shell`},
		},
		{
			name: "exec and shell forms",
			src: "FROM alpine\nRUN [\"sh\", \"-c\", \"echo $HOME\"]\nRUN [ -f /etc/os-release ] && cat /etc/os-release\n" +
				"CMD []\nENTRYPOINT echo \"$X\"\nCMD [\"a\\u0041\"]\n",
			want: []string{`1 FROM ["alpine"]`, `2 RUN ["sh" "-c" "echo $HOME"]`,
				`3 RUN ["[ -f /etc/os-release ] && cat /etc/os-release"] shell`,
				`4 CMD []`, `5 ENTRYPOINT ["echo \"$X\""] shell`, `6 CMD ["aA"]`},
		},
		{
			name: "RUN, CMD and ENTRYPOINT are not expanded",
			src:  "FROM alpine\nENV A=1\nRUN echo $A ${A:-x} \\$A\nCMD [\"$A\"]\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["A=1"]`, `3 RUN ["echo $A ${A:-x} \\$A"] shell`, `4 CMD ["$A"]`},
		},
		{
			name: "ENV forms",
			src: "FROM alpine\nENV K=V K2=\"v 2\" K3='$K' K4=\\$K K5=\nENV LEGACY some value  here\nENV LEG2 \"quoted value\" $K\n" +
				"ENV A=$K B=${K2}x\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["K=V" "K2=v 2" "K3=$K" "K4=$K" "K5="]`,
				`3 ENV kv["LEGACY=some value  here"]`, `4 ENV kv["LEG2=quoted value V"]`, `5 ENV kv["A=V" "B=v 2x"]`},
		},
		{
			name: "ENV substitutions see the environment before the instruction",
			src:  "FROM alpine\nENV abc=hello\nENV abc=bye def=$abc\nENV ghi=$abc\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["abc=hello"]`, `3 ENV kv["abc=bye" "def=hello"]`, `4 ENV kv["ghi=bye"]`},
		},
		{
			name: "LABEL pairs",
			src:  "FROM alpine\nENV V=1.0\nLABEL \"com.example.vendor\"=\"ACME Inc\" version=$V description=\"a \\\"b\\\"\"\nLABEL legacy the rest\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["V=1.0"]`,
				`3 LABEL kv["com.example.vendor=ACME Inc" "version=1.0" "description=a \"b\""]`, `4 LABEL kv["legacy=the rest"]`},
		},
		{
			name: "ARG defaults, overrides and scope",
			src: "ARG BASE=alpine\nARG TAG\nFROM $BASE:${TAG:-latest}\nRUN a\nARG BASE\nARG V=1 W\nARG X=${V}0\nRUN b\n" +
				"ENV V=env\nRUN c\nCOPY $V$W$X /d\n",
			args: map[string]string{"W": "w"},
			want: []string{`3 FROM ["alpine:latest"]`, `4 RUN ["a"] shell`, `5 ARG kv["BASE="]`, `6 ARG kv["V=1" "W="]`,
				`7 ARG kv["X=10"]`, `8 RUN ["b"] shell args["BASE=alpine" "V=1" "W=w" "X=10"]`, `9 ENV kv["V=env"]`,
				`10 RUN ["c"] shell args["BASE=alpine" "W=w" "X=10"]`, `11 COPY ["envw10" "/d"]`},
		},
		{
			name: "build args override ARG defaults and global ARGs",
			src:  "ARG BASE=alpine\nFROM ${BASE}\nARG BASE\nARG V=1\nWORKDIR /$BASE/$V\n",
			args: map[string]string{"BASE": "debian", "V": "2"},
			want: []string{`2 FROM ["debian"]`, `3 ARG kv["BASE="]`, `4 ARG kv["V=1"]`, `5 WORKDIR ["/debian/2"]`},
		},
		{
			name: "global ARGs are not visible in the stage until redeclared",
			src:  "ARG DIR=/srv\nFROM alpine\nWORKDIR /x$DIR\nARG DIR\nWORKDIR $DIR\n",
			want: []string{`2 FROM ["alpine"]`, `3 WORKDIR ["/x"]`, `4 ARG kv["DIR="]`, `5 WORKDIR ["/srv"]`},
		},
		{
			name: "undeclared ARG is unset, not empty",
			src:  "FROM alpine\nARG U\nARG E=\nWORKDIR /${U-unset}/${E-unset}/${E:-empty}\nRUN x\n",
			want: []string{`1 FROM ["alpine"]`, `2 ARG kv["U="]`, `3 ARG kv["E="]`, `4 WORKDIR ["/unset/empty"]`, `5 RUN ["x"] shell args["E="]`},
		},
		{
			name: "automatic platform ARGs",
			src:  "FROM alpine:${TARGETARCH}\nARG TARGETOS TARGETARCH\nRUN x\n",
			want: []string{`1 FROM ["alpine:` + runtime.GOARCH + `"]`, `2 ARG kv["TARGETOS=" "TARGETARCH="]`,
				`3 RUN ["x"] shell args["TARGETARCH=` + runtime.GOARCH + `" "TARGETOS=linux"]`},
		},
		{
			name: "FROM flags",
			src:  "ARG P=linux/amd64\nFROM --platform=$P alpine\n",
			want: []string{`2 FROM ["alpine"] flags["platform=linux/amd64"]`},
		},
		{
			name: "EXPOSE",
			src:  "FROM alpine\nENV PORTS=\"9000 9001/udp\"\nEXPOSE 80/tcp 443 53/UDP 8000-8002/tcp $PORTS 80\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["PORTS=9000 9001/udp"]`,
				`3 EXPOSE ["80/tcp" "443/tcp" "53/udp" "8000/tcp" "8001/tcp" "8002/tcp" "9000/tcp" "9001/udp"]`},
		},
		{
			name: "WORKDIR relative to the previous one",
			src:  "FROM alpine\nWORKDIR a\nWORKDIR b/c/\nWORKDIR ../d\nWORKDIR /abs\nWORKDIR e\nENV H=/home\nWORKDIR ${H}/u\nWORKDIR /with space\n",
			want: []string{`1 FROM ["alpine"]`, `2 WORKDIR ["/a"]`, `3 WORKDIR ["/a/b/c"]`, `4 WORKDIR ["/a/b/d"]`, `5 WORKDIR ["/abs"]`,
				`6 WORKDIR ["/abs/e"]`, `7 ENV kv["H=/home"]`, `8 WORKDIR ["/home/u"]`, `9 WORKDIR ["/with space"]`},
		},
		{
			name: "USER",
			src:  "FROM alpine\nENV U=app G=staff\nUSER $U:${G}\nUSER 1000\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["U=app" "G=staff"]`, `3 USER ["app:staff"]`, `4 USER ["1000"]`},
		},
		{
			name: "COPY and ADD",
			src: "FROM alpine\nENV D=/app S=src UID=1000\nCOPY $S/*.py ${S}/lib $D/\nCOPY [\"my file.txt\", \"$D/dir with space/\"]\n" +
				"ADD --chown=${UID}:${UID} --chmod=755 tool.tar.gz /opt/\nCOPY --chown=\"app:app\" -- --odd-name /x\nCOPY \\$S /lit\n",
			want: []string{`1 FROM ["alpine"]`, `2 ENV kv["D=/app" "S=src" "UID=1000"]`, `3 COPY ["src/*.py" "src/lib" "/app/"]`,
				`4 COPY ["my file.txt" "/app/dir with space/"]`, `5 ADD ["tool.tar.gz" "/opt/"] flags["chmod=755" "chown=1000:1000"]`,
				`6 COPY ["--odd-name" "/x"] flags["chown=app:app"]`, `7 COPY ["$S" "/lit"]`},
		},
		{
			name: "RUN heredoc-like text that is not a heredoc",
			src:  "FROM alpine\nRUN echo '<<EOF' \"a <<EOF\" x<<y $((1<<2)) <<<str\n",
			want: []string{`1 FROM ["alpine"]`, `2 RUN ["echo '<<EOF' \"a <<EOF\" x<<y $((1<<2)) <<<str"] shell`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			df := mustParse(t, tc.src, tc.args)
			diffLines(t, "instructions", renderAll(df.Instructions), tc.want)
		})
	}
}

func TestParseMetadata(t *testing.T) {
	df := mustParse(t, "# escape=`\n# syntax=docker/dockerfile:1.7\nFROM Alpine:3 as Builder\n",
		map[string]string{"UNUSED": "1", "ALSO": "2", "http_proxy": "x"})
	if df.Escape != '`' || df.Syntax != "docker/dockerfile:1.7" || df.Base != "Alpine:3" || df.Stage != "builder" {
		t.Errorf("got escape %q syntax %q base %q stage %q", df.Escape, df.Syntax, df.Base, df.Stage)
	}
	if !reflect.DeepEqual(df.UnusedBuildArgs, []string{"ALSO", "UNUSED"}) {
		t.Errorf("UnusedBuildArgs = %q", df.UnusedBuildArgs)
	}
}

func TestParseWithBase(t *testing.T) {
	var asked []string
	opt := Options{
		BuildArgs: map[string]string{"V": "3.12"},
		Base: func(image string) ([]string, string, error) {
			asked = append(asked, image)
			return []string{"PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "ODD"}, "/home/app", nil
		},
	}
	df, err := ParseWith(strings.NewReader("ARG V\nFROM python:$V\nENV PATH=/venv/bin:$PATH\nWORKDIR src\nARG LANG=en\nRUN x\n"), opt)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`2 FROM ["python:3.12"]`, `3 ENV kv["PATH=/venv/bin:/usr/local/bin:/usr/bin"]`, `4 WORKDIR ["/home/app/src"]`,
		`5 ARG kv["LANG=en"]`, `6 RUN ["x"] shell`}
	diffLines(t, "instructions", renderAll(df.Instructions), want)
	if !reflect.DeepEqual(asked, []string{"python:3.12"}) {
		t.Errorf("Base asked for %q", asked)
	}

	opt.Base = func(string) ([]string, string, error) { return nil, "", errors.New("no such image") }
	_, err = ParseWith(strings.NewReader("# c\nFROM nope\n"), opt)
	if err == nil || err.Error() != "Dockerfile line 2: base image nope: no such image" {
		t.Errorf("err = %v", err)
	}
	opt.Base = func(string) ([]string, string, error) { t.Error("Base called for scratch"); return nil, "", nil }
	if _, err := ParseWith(strings.NewReader("FROM scratch\n"), opt); err != nil {
		t.Error(err)
	}
}

func TestParseErrors(t *testing.T) {
	const supported = "(supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, LABEL, EXPOSE, CMD, ENTRYPOINT)"
	for _, tc := range []struct {
		src  string
		args map[string]string
		want string
	}{
		{"", nil, "Dockerfile line 1: no FROM instruction: a Dockerfile must have a FROM (only ARG may come before it)"},
		{"# only a comment\n\nARG A=1\n", nil, "Dockerfile line 3: no FROM instruction: a Dockerfile must have a FROM (only ARG may come before it)"},
		{"ARG A\nRUN echo\nFROM alpine\n", nil, "Dockerfile line 2: RUN before FROM: a Dockerfile must begin with FROM (only ARG may come before it)"},
		{"FROM alpine\nRUN a\nFROM debian\n", nil, "Dockerfile line 3: multi-stage builds are not supported yet"},
		{"FROM alpine\nHEALTHCHECK CMD curl -f http://localhost/\n", nil, "Dockerfile line 2: HEALTHCHECK is not supported " + supported},
		{"FROM alpine\n\nVOLUME /data\n", nil, "Dockerfile line 3: VOLUME is not supported " + supported},
		{"FROM alpine\nstopsignal SIGTERM\n", nil, "Dockerfile line 2: STOPSIGNAL is not supported " + supported},
		{"FROM alpine\nSHELL [\"bash\", \"-c\"]\n", nil, "Dockerfile line 2: SHELL is not supported " + supported},
		{"FROM alpine\nONBUILD RUN x\n", nil, "Dockerfile line 2: ONBUILD is not supported " + supported},
		{"ONBUILD RUN x\n", nil, "Dockerfile line 1: ONBUILD is not supported " + supported},
		{"FROM alpine\nRUNN x\n", nil, `Dockerfile line 2: unknown instruction "RUNN" ` + supported},
		{"FROM\n", nil, "Dockerfile line 1: FROM requires an argument"},
		{"FROM alpine\n\n  RUN   \n", nil, "Dockerfile line 3: RUN requires an argument"},
		{"FROM alpine\nCMD\n", nil, "Dockerfile line 2: CMD requires an argument"},
		{"FROM alpine\nENV\n", nil, "Dockerfile line 2: ENV requires an argument"},
		{"FROM alpine\nWORKDIR\n", nil, "Dockerfile line 2: WORKDIR requires an argument"},
		{"FROM alpine\nCOPY\n", nil, "Dockerfile line 2: COPY requires at least two arguments: source(s) and destination"},
		{"FROM alpine\nCOPY --chown=1:1\n", nil, "Dockerfile line 2: COPY requires at least two arguments: source(s) and destination"},
		{"FROM alpine\nADD only\n", nil, "Dockerfile line 2: ADD requires at least two arguments: source(s) and destination"},
		{"FROM alpine\nCOPY [\"a\"]\n", nil, "Dockerfile line 2: COPY requires at least two arguments: source(s) and destination"},
		{"FROM alpine\nRUN []\n", nil, "Dockerfile line 2: RUN requires a command"},
		{"FROM alpine\nCOPY a b /c\n", nil, "Dockerfile line 2: COPY with more than one source needs a destination directory ending in /"},
		{"FROM alpine\nRUN <<EOF\necho hi\nEOF\n", nil, "Dockerfile line 2: heredocs are not supported (<<EOF)"},
		{"FROM alpine\nRUN cat <<-'END' > /f\nx\nEND\n", nil, "Dockerfile line 2: heredocs are not supported (<<-'END')"},
		{"FROM alpine\nCOPY <<EOF /etc/motd\nhi\nEOF\n", nil, "Dockerfile line 2: heredocs are not supported (<<EOF)"},
		{"FROM alpine\nADD https://example.com/a.tgz /a\n", nil, "Dockerfile line 2: ADD of a URL or git repository (https://example.com/a.tgz) is not supported; download it in a RUN instead"},
		{"FROM alpine\nADD git@github.com:a/b.git /b\n", nil, "Dockerfile line 2: ADD of a URL or git repository (git@github.com:a/b.git) is not supported; download it in a RUN instead"},
		{"FROM alpine\nCOPY http://example.com/a /a\n", nil, "Dockerfile line 2: COPY source http://example.com/a is a URL: COPY takes files from the build context only"},
		{"FROM alpine\nCOPY --from=builder /app /app\n", nil, "Dockerfile line 2: COPY --from is not supported (multi-stage builds are not supported yet)"},
		{"FROM alpine\nADD --link a /a\n", nil, "Dockerfile line 2: ADD --link is not supported"},
		{"FROM alpine\nCOPY --link a /a\n", nil, "Dockerfile line 2: COPY --link is not supported"},
		{"FROM alpine\nADD --checksum=sha256:00 a /a\n", nil, "Dockerfile line 2: ADD --checksum is not supported"},
		{"FROM alpine\nRUN --mount=type=cache,target=/root/.cache pip install x\n", nil, "Dockerfile line 2: RUN --mount is not supported"},
		{"FROM alpine\nCOPY --own=1 a /a\n", nil, "Dockerfile line 2: unknown flag --own for COPY"},
		{"FROM alpine\nENV --x=1 A=1\n", nil, "Dockerfile line 2: unknown flag --x for ENV"},
		{"FROM alpine\nCOPY --chown a /a\n", nil, "Dockerfile line 2: COPY --chown needs a value (--chown=...)"},
		{"FROM alpine\nCOPY --chown=1 --chown=2 a /a\n", nil, "Dockerfile line 2: COPY: --chown given twice"},
		{"FROM alpine\nCOPY --chmod=u+x a /a\n", nil, "Dockerfile line 2: COPY --chmod=u+x: not an octal mode (symbolic modes are not supported)"},
		{"FROM alpine\nCOPY --chmod=17777 a /a\n", nil, "Dockerfile line 2: COPY --chmod=17777: not an octal mode up to 7777"},
		{"FROM alpine\nENV K\n", nil, "Dockerfile line 2: ENV must have two arguments (name value) or be name=value pairs"},
		{"FROM alpine\nENV a=1 b\n", nil, `Dockerfile line 2: ENV: can't find = in "b"; must be of the form name=value`},
		{"FROM alpine\nENV =1\n", nil, "Dockerfile line 2: ENV: names can not be blank"},
		{"FROM alpine\nLABEL \"\"=1\n", nil, "Dockerfile line 2: LABEL names can not be blank"},
		{"FROM alpine\nARG =x\n", nil, "Dockerfile line 2: ARG: names can not be blank"},
		{"FROM alpine\nENV A=\"unterminated\n", nil, `Dockerfile line 2: ENV: unexpected end of statement while looking for matching double-quote`},
		{"FROM alpine\nWORKDIR ${HOME\n", nil, `Dockerfile line 2: WORKDIR: syntax error: missing '}'`},
		{"FROM alpine\nWORKDIR ${}\n", nil, `Dockerfile line 2: WORKDIR: syntax error: bad substitution`},
		{"FROM alpine\nUSER ${U:?must be set}\n", nil, `Dockerfile line 2: USER: U: must be set`},
		{"FROM alpine\nUSER ${U:3}\n", nil, `Dockerfile line 2: USER: unsupported modifier (:3) in substitution`},
		{"FROM alpine\nUSER $EMPTY\n", nil, "Dockerfile line 2: USER is empty after substitution"},
		{"FROM alpine\nCOPY $EMPTY /x\n", nil, "Dockerfile line 2: COPY source is empty after substitution"},
		{"FROM $EMPTY\n", nil, `Dockerfile line 1: FROM image "" is not a valid image reference after substitution`},
		{"FROM alpine AS\n", nil, "Dockerfile line 1: FROM takes an image, optionally followed by AS name"},
		{"FROM alpine AS 1st\n", nil, `Dockerfile line 1: invalid build stage name "1st": must start with a letter and contain only letters, digits, '-', '_' and '.'`},
		{"FROM alpine\nEXPOSE http\n", nil, "Dockerfile line 2: EXPOSE http: want a port (1-65535) or a range of ports, optionally followed by /tcp, /udp or /sctp"},
		{"FROM alpine\nEXPOSE 70000\n", nil, "Dockerfile line 2: EXPOSE 70000: want a port (1-65535) or a range of ports, optionally followed by /tcp, /udp or /sctp"},
		{"FROM alpine\nEXPOSE 80/icmp\n", nil, "Dockerfile line 2: EXPOSE 80/icmp: protocol must be tcp, udp or sctp"},
		{"FROM alpine\nEXPOSE 1-65535 1-65535/udp\nEXPOSE 1-65535/sctp 80\n", nil, "Dockerfile line 3: EXPOSE 80: too many ports: a Dockerfile may expose at most 196605 (ranges expanded)"},
		{"FROM alpine\nEXPOSE 90-80\n", nil, "Dockerfile line 2: EXPOSE 90-80: the range is empty"},
		{"FROM alpine\nCMD [\"a\", 1]\n", nil, "Dockerfile line 2: CMD: when using the JSON array form, its elements must all be strings"},
		{"# escape=x\nFROM alpine\n", nil, "Dockerfile line 1: invalid escape parser directive \"x\": must be ` or \\"},
		{"# escape=`\n# escape=\\\nFROM alpine\n", nil, "Dockerfile line 2: only one escape parser directive can be used"},
		// Errors name the line where a continued instruction starts.
		{"FROM alpine\nRUN ok\nENV A=1 \\\n  B=2 \\\n  C\n", nil, `Dockerfile line 3: ENV: can't find = in "C"; must be of the form name=value`},
		{"FROM alpine\nCOPY \\\n  a \\\n  b \\\n  c\n", nil, "Dockerfile line 2: COPY with more than one source needs a destination directory ending in /"},
	} {
		_, err := Parse(strings.NewReader(tc.src), tc.args)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want %q", tc.src, tc.want)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("Parse(%q)\n  err = %s\n want = %s", tc.src, err, tc.want)
		}
		var e *Error
		if !errors.As(err, &e) || e.Line < 1 {
			t.Errorf("Parse(%q) error %T is not an *Error with a line", tc.src, err)
		}
	}
}

func TestParseTooLarge(t *testing.T) {
	_, err := Parse(strings.NewReader("FROM a\n"+strings.Repeat("#", MaxSize)), nil)
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("err = %v", err)
	}
}
