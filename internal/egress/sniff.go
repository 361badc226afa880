package egress

import (
	"bytes"
	"errors"
	"strings"
)

// maxPeek bounds what the transparent proxy reads before deciding.
const maxPeek = 16 << 10

// errNeedMore means the bytes so far are a valid prefix; read more.
var errNeedMore = errors.New("need more data")

// sniffKind says what the first bytes of a connection were.
type sniffKind int

const (
	sniffNone sniffKind = iota // neither TLS nor HTTP/1 (or no name in it)
	sniffTLS
	sniffHTTP
)

// sniff looks at the first bytes of a client's stream. It returns the kind
// of protocol recognised and the name the client asked for (the TLS SNI, or
// the HTTP/1 Host), "" when there is none. err is errNeedMore when b is a
// valid but incomplete prefix, or describes malformed input that must not
// be trusted.
func sniff(b []byte) (kind sniffKind, name string, err error) {
	if len(b) == 0 {
		return sniffNone, "", errNeedMore
	}
	if b[0] == 0x16 {
		name, err := parseSNI(b)
		return sniffTLS, name, err
	}
	if looksLikeHTTP(b) {
		name, err := parseHTTPHost(b)
		return sniffHTTP, name, err
	}
	return sniffNone, "", nil
}

// parseSNI extracts the server_name of a TLS ClientHello that starts b,
// reassembling the handshake message across records. It returns "" and no
// error for a ClientHello without a host_name.
func parseSNI(b []byte) (string, error) {
	var hs []byte // handshake bytes collected from records
	rest := b
	for {
		if len(rest) < 5 {
			return "", errNeedMore
		}
		if rest[0] != 0x16 {
			return "", errors.New("tls: not a handshake record")
		}
		if rest[1] != 3 {
			return "", errors.New("tls: bad record version")
		}
		n := int(rest[3])<<8 | int(rest[4])
		if n == 0 || n > 16384 {
			return "", errors.New("tls: bad record length")
		}
		if len(rest) < 5+n {
			// Parse what we have only when the handshake header says the
			// message is already complete; else wait for the record.
			return "", errNeedMore
		}
		hs = append(hs, rest[5:5+n]...)
		rest = rest[5+n:]
		if len(hs) >= 4 {
			if hs[0] != 1 {
				return "", errors.New("tls: not a ClientHello")
			}
			mlen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if mlen > maxPeek {
				return "", errors.New("tls: ClientHello too long")
			}
			if len(hs) >= 4+mlen {
				return clientHelloSNI(hs[4 : 4+mlen])
			}
		}
	}
}

// cursor is a bounds-checked reader over a byte slice.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) u8() int {
	if len(c.b) < 1 {
		c.bad = true
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v
}

func (c *cursor) u16() int {
	if len(c.b) < 2 {
		c.bad = true
		return 0
	}
	v := int(c.b[0])<<8 | int(c.b[1])
	c.b = c.b[2:]
	return v
}

func (c *cursor) bytes(n int) []byte {
	if n < 0 || len(c.b) < n {
		c.bad = true
		c.b = nil
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

var errBadHello = errors.New("tls: malformed ClientHello")

func clientHelloSNI(m []byte) (string, error) {
	c := &cursor{b: m}
	c.bytes(2)       // legacy_version
	c.bytes(32)      // random
	c.bytes(c.u8())  // legacy_session_id
	c.bytes(c.u16()) // cipher_suites
	c.bytes(c.u8())  // legacy_compression_methods
	if c.bad {
		return "", errBadHello
	}
	if len(c.b) == 0 {
		return "", nil // no extensions
	}
	exts := &cursor{b: c.bytes(c.u16())}
	if c.bad || len(c.b) != 0 {
		return "", errBadHello
	}
	name := ""
	seen := false
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.bytes(exts.u16())
		if exts.bad {
			return "", errBadHello
		}
		if typ != 0 {
			continue
		}
		if seen {
			return "", errors.New("tls: two server_name extensions")
		}
		seen = true
		sn := &cursor{b: data}
		list := &cursor{b: sn.bytes(sn.u16())}
		if sn.bad || len(sn.b) != 0 {
			return "", errBadHello
		}
		for len(list.b) > 0 {
			nt := list.u8()
			v := list.bytes(list.u16())
			if list.bad {
				return "", errBadHello
			}
			if nt != 0 {
				continue
			}
			if name != "" {
				return "", errors.New("tls: two host_names in server_name")
			}
			if len(v) == 0 {
				return "", errBadHello
			}
			name = string(v)
		}
	}
	return name, nil
}

// httpMethods are the request methods the transparent proxy recognises as
// HTTP/1; other bytes are treated as an opaque protocol.
var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "CONNECT ", "OPTIONS ", "TRACE ", "PATCH ",
	"PROPFIND ", "PROPPATCH ", "MKCOL ", "COPY ", "MOVE ", "LOCK ", "UNLOCK ", "REPORT ", "MKACTIVITY ", "CHECKOUT ", "MERGE ", "SEARCH ", "PURGE "}

// looksLikeHTTP reports whether b starts (or could start) with a request
// line of a known method.
func looksLikeHTTP(b []byte) bool {
	for _, m := range httpMethods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// parseHTTPHost reads the request line and header of an HTTP/1 request at
// the start of b and returns the host it is for (without port): the host of
// an absolute-form target, else the Host header. Conflicting or repeated
// hosts are an error; a request without either gives "".
func parseHTTPHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= maxPeek {
			return "", errors.New("http: header larger than 16 KiB")
		}
		return "", errNeedMore
	}
	head := string(b[:end])
	lines := strings.Split(head, "\r\n")
	for _, l := range lines {
		for i := 0; i < len(l); i++ {
			// Bare CR or LF, NUL and other controls: servers disagree on
			// them, so trust nothing.
			if c := l[i]; c < 0x20 && c != '\t' || c == 0x7f {
				return "", errors.New("http: control character in the request head")
			}
		}
	}
	reqLine := strings.Split(lines[0], " ")
	if len(reqLine) != 3 || (reqLine[2] != "HTTP/1.1" && reqLine[2] != "HTTP/1.0") || reqLine[1] == "" {
		return "", errors.New("http: bad request line")
	}
	var urlHost string
	target := reqLine[1]
	if i := strings.Index(target, "://"); i > 0 && target[0] != '/' {
		auth := target[i+3:]
		if j := strings.IndexAny(auth, "/?#"); j >= 0 {
			auth = auth[:j]
		}
		if strings.ContainsAny(auth, "@%") {
			return "", errors.New("http: userinfo or '%' in request target")
		}
		h, err := hostOnly(auth)
		if err != nil {
			return "", err
		}
		urlHost = h
	} else if reqLine[0] == "CONNECT" {
		h, err := hostOnly(target)
		if err != nil {
			return "", err
		}
		urlHost = h
	}
	var host string
	seen := false
	for _, l := range lines[1:] {
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return "", errors.New("http: folded or empty header line")
		}
		colon := strings.IndexByte(l, ':')
		if colon <= 0 {
			return "", errors.New("http: bad header line")
		}
		k := l[:colon]
		if strings.TrimRight(k, " \t") != k {
			return "", errors.New("http: white space before colon")
		}
		if !strings.EqualFold(k, "host") {
			continue
		}
		if seen {
			return "", errors.New("http: more than one Host header")
		}
		seen = true
		h, err := hostOnly(strings.Trim(l[colon+1:], " \t"))
		if err != nil {
			return "", err
		}
		host = h
	}
	if urlHost != "" {
		if host != "" && !strings.EqualFold(strings.TrimSuffix(host, "."), strings.TrimSuffix(urlHost, ".")) {
			return "", errors.New("http: Host header differs from the request target")
		}
		return urlHost, nil
	}
	return host, nil
}

// hostOnly strips an optional port from a Host value ("h", "h:80",
// "[v6]", "[v6]:80").
func hostOnly(hp string) (string, error) {
	if hp == "" {
		return "", nil
	}
	if strings.ContainsAny(hp, "@%/\\ \t\x00") {
		return "", errors.New("http: invalid character in host")
	}
	if hp[0] == '[' {
		end := strings.IndexByte(hp, ']')
		if end < 0 {
			return "", errors.New("http: bad IPv6 host")
		}
		rest := hp[end+1:]
		if rest != "" && (rest[0] != ':' || !isPort(rest[1:])) {
			return "", errors.New("http: bad port")
		}
		return hp[:end+1], nil
	}
	if i := strings.IndexByte(hp, ':'); i >= 0 {
		if !isPort(hp[i+1:]) {
			return "", errors.New("http: bad port")
		}
		hp = hp[:i]
		if hp == "" {
			return "", errors.New("http: empty host")
		}
	}
	return hp, nil
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n > 0 && n <= 65535
}
