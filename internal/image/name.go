package image

import (
	"fmt"
	"strings"
)

// MaxNameLen bounds an image reference.
const MaxNameLen = 255

// CheckName reports why s is not a usable image reference, or nil. A
// reference is [DOMAIN[:PORT]/]PATH[:TAG][@ALGORITHM:DIGEST] in the grammar
// of Docker's distribution/reference: PATH is components of lower-case
// letters and digits joined by '.', '_', '__' or dashes, separated by '/';
// so no component is empty, "." or "..", and nothing else (spaces,
// backslashes, control characters, upper case in the path) passes. Every
// endpoint that takes an image name checks it with this one function.
func CheckName(s string) error {
	if s == "" {
		return fmt.Errorf("empty image name")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("image name of %d bytes, over %d", len(s), MaxNameLen)
	}
	name, digest, hasDigest := strings.Cut(s, "@")
	if hasDigest {
		if err := checkDigest(digest); err != nil {
			return err
		}
	}
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		if err := checkTag(name[i+1:]); err != nil {
			return err
		}
		name = name[:i]
	}
	comps := strings.Split(name, "/")
	// The first component names a registry when it looks like a host
	// (as Docker splits it: a '.', a ':', localhost, or upper case).
	if len(comps) > 1 && (strings.ContainsAny(comps[0], ".:") || comps[0] == "localhost" || strings.ToLower(comps[0]) != comps[0]) {
		if err := checkDomain(comps[0]); err != nil {
			return err
		}
		comps = comps[1:]
	}
	for _, c := range comps {
		if err := checkComponent(c); err != nil {
			return err
		}
	}
	return nil
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// checkComponent: [a-z0-9]+ ((\.|_|__|-+)[a-z0-9]+)*
func checkComponent(c string) error {
	switch c {
	case "":
		return fmt.Errorf("empty path component (a leading, trailing or doubled '/')")
	case ".", "..":
		return fmt.Errorf("path component %q", c)
	}
	if !isLowerAlnum(c[0]) || !isLowerAlnum(c[len(c)-1]) {
		return fmt.Errorf("path component %q does not start and end with a lower-case letter or digit", c)
	}
	for i := 0; i < len(c); {
		if isLowerAlnum(c[i]) {
			i++
			continue
		}
		j := i
		for j < len(c) && !isLowerAlnum(c[j]) {
			j++
		}
		switch sep := c[i:j]; {
		case sep == "." || sep == "_" || sep == "__" || strings.Trim(sep, "-") == "":
		default:
			return fmt.Errorf("path component %q: %q is not a separator (one '.', one or two '_', or dashes) of lower-case letters and digits", c, sep)
		}
		i = j
	}
	return nil
}

// checkTag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
func checkTag(t string) error {
	if t == "" || len(t) > 128 {
		return fmt.Errorf("tag %q: 1 to 128 characters", t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !isAlnum(c) && c != '_' && (i == 0 || c != '.' && c != '-') {
			return fmt.Errorf("tag %q: letters, digits, '_', and '.' or '-' after the first", t)
		}
	}
	return nil
}

// checkDomain: host components [A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])? joined
// by '.', then an optional :PORT.
func checkDomain(d string) error {
	host, port, hasPort := strings.Cut(d, ":")
	if hasPort {
		if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
			return fmt.Errorf("registry %q: the port is not a number", d)
		}
	}
	for _, c := range strings.Split(host, ".") {
		if c == "" || !isAlnum(c[0]) || !isAlnum(c[len(c)-1]) {
			return fmt.Errorf("registry %q: bad host name", d)
		}
		for i := 0; i < len(c); i++ {
			if !isAlnum(c[i]) && c[i] != '-' {
				return fmt.Errorf("registry %q: bad host name", d)
			}
		}
	}
	return nil
}

// checkDigest: ALGORITHM:HEX, sha256 with 64 lower-case hex digits (the
// only algorithm den verifies).
func checkDigest(d string) error {
	alg, hex, _ := strings.Cut(d, ":")
	if alg != "sha256" || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return fmt.Errorf("digest %q: want sha256: and 64 lower-case hex digits", d)
	}
	return nil
}
