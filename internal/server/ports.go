package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

func portParam(w http.ResponseWriter, r *http.Request) (int, bool) {
	p, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || p < 1 || p > 65535 {
		writeError(w, api.FieldError("port", "%q is not a TCP port (1-65535)", r.PathValue("port")))
		return 0, false
	}
	return p, true
}

func (s *Server) sharePort(w http.ResponseWriter, r *http.Request) {
	var req api.PortRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	p, err := s.m.SharePort(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 201, p)
}

func (s *Server) unsharePort(w http.ResponseWriter, r *http.Request) {
	port, ok := portParam(w, r)
	if !ok {
		return
	}
	if err := s.m.UnsharePort(r.Context(), r.PathValue("id"), port); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

// preview is den's reverse proxy to a shared port: HTTP and WebSocket, to
// servers bound to 0.0.0.0 or only to 127.0.0.1 inside the sandbox.
// Private previews take the token as ?den_token=, the X-Den-Token header,
// or the cookie set on the first visit.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	port, _ := strconv.Atoi(r.PathValue("port")) // a bad port is refused like any other preview
	s.servePreview(w, r, r.PathValue("id"), port, "/preview/"+r.PathValue("id")+"/"+r.PathValue("port"))
}

// forwardedHeaders are the proxy headers a client may send to make the
// server inside believe another host, scheme or prefix: den drops them
// and sets its own.
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Forwarded-Prefix", "X-Forwarded-Port", "X-Forwarded-Server", "X-Forwarded-Ssl", "X-Real-Ip"}

// servePreview proxies a preview request for port of sandbox id. prefix is
// the path the preview is mounted at ("" for host-name previews); it is
// stripped, and sent as X-Forwarded-Prefix, unless the server serves under
// it itself (see sandbox.Manager.PreviewKeepsPrefix).
func (s *Server) servePreview(w http.ResponseWriter, r *http.Request, id string, port int, prefix string) {
	cookie := "den_preview_" + strconv.Itoa(port)
	token := r.URL.Query().Get("den_token")
	if token == "" {
		token = r.Header.Get("X-Den-Token")
	}
	if token == "" {
		if c, err := r.Cookie(cookie); err == nil {
			token = c.Value
		}
	}
	sid, keep, err := s.m.PreviewAllowed(r.Context(), id, port, token)
	if err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("den_token") != "" {
		// Host-only (no Domain): on a host-name preview it goes with
		// every request to that host, the page's root-relative
		// sub-resources and WebSockets included, and to no other.
		http.SetCookie(w, &http.Cookie{Name: cookie, Value: token, Path: prefix + "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	strip := prefix != "" && !keep
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(port)
			if strip {
				pr.Out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, prefix), "/")
				pr.Out.URL.RawPath = ""
			}
			pr.Out.URL.RawQuery = withoutToken(pr.Out.URL.Query())
			pr.Out.Header.Del("X-Den-Token")
			pr.Out.Header.Del("Authorization")
			dropCookie(pr.Out.Header, cookie)
			for _, h := range forwardedHeaders {
				pr.Out.Header.Del(h)
			}
			pr.SetXForwarded()
			if strip {
				pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			}
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.m.DialPort(ctx, sid, port)
			},
			DisableCompression: true,
		},
		ModifyResponse: func(resp *http.Response) error {
			if strip && redirectsTo(resp, r.Host, r.URL.Path, withoutToken(r.URL.Query())) {
				// Stripped, the server sends the browser back to the
				// path it asked for: it serves under the prefix itself
				// (Vite's --base, Jupyter's base_url). The browser
				// follows the redirect, which now passes unstripped.
				if err := s.m.PreviewKeepsPrefix(context.WithoutCancel(r.Context()), sid, port); err != nil {
					s.log.Warn("preview: keep the prefix", "sandbox", sid, "port", port, "err", err)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, api.Errorf(api.KindConflict, "preview of port %d: %v", port, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// redirectsTo reports whether resp is a redirect to path?query on host:
// back to the URL the browser asked for (its token aside).
func redirectsTo(resp *http.Response, host, path, query string) bool {
	if resp.StatusCode < 300 || resp.StatusCode > 399 {
		return false
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	return err == nil && (loc.Host == "" || loc.Host == host) && loc.Path == path && withoutToken(loc.Query()) == query
}

// withoutToken is a query without den_token, encoded.
func withoutToken(q url.Values) string {
	q.Del("den_token")
	return q.Encode()
}

// dropCookie removes the cookie name from a request's Cookie headers: the
// preview's token is den's, not the server's.
func dropCookie(h http.Header, name string) {
	r := http.Request{Header: h}
	var kept []string
	for _, c := range r.Cookies() {
		if c.Name != name {
			kept = append(kept, c.String())
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

// PreviewHost routes requests for PORT-ID.DOMAIN, for each of domains
// (empty ones ignored), to the preview proxy; other requests go to next.
// A host under a preview domain that is not exactly PORT-ID.DOMAIN, with
// an optional :port (a trailing dot, a port written otherwise than den
// writes it, a bad :port) is refused like any other preview. Under
// localhost, which other names share, only names whose label before
// .localhost starts with a digit are previews.
func (s *Server) PreviewHost(next http.Handler, domains ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port, ok := previewHost(r.Host, domains)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		s.servePreview(w, r, id, port, "")
	})
}

// previewHost reads a Host header: ok when it names a host under one of
// domains, then id and port are the preview's, or empty and 0 when the
// host is malformed.
func previewHost(host string, domains []string) (id string, port int, ok bool) {
	name, hport, colon := strings.ToLower(host), "", false
	if i := strings.LastIndexByte(name, ':'); i >= 0 && !strings.HasSuffix(name, "]") {
		name, hport, colon = name[:i], name[i+1:], true
	}
	for _, d := range domains {
		suffix := "." + strings.ToLower(d)
		rest, under := strings.CutSuffix(strings.TrimSuffix(name, "."), suffix)
		label := rest[strings.LastIndexByte(rest, '.')+1:]
		if d == "" || !under || d == "localhost" && (label == "" || label[0] < '0' || label[0] > '9') {
			// *.localhost is not den's alone: only names whose label
			// before it starts with a digit are previews there; a
			// preview domain is all previews.
			continue
		}
		if strings.HasSuffix(name, ".") {
			return "", 0, true
		}
		if hp, err := strconv.Atoi(hport); colon && (err != nil || hp < 1 || hp > 65535 || strconv.Itoa(hp) != hport) {
			return "", 0, true
		}
		portS, id, _ := strings.Cut(rest, "-")
		p, err := strconv.Atoi(portS)
		if err != nil || strconv.Itoa(p) != portS {
			return "", 0, true
		}
		return id, p, true // id is checked to be a full id, port a TCP port, by PreviewAllowed
	}
	return "", 0, false
}

// tcp bridges a WebSocket to a raw TCP connection to a port inside the
// sandbox, for den forward: binary messages carry the bytes both ways.
func (s *Server) tcp(w http.ResponseWriter, r *http.Request) {
	port, ok := portParam(w, r)
	if !ok {
		return
	}
	conn, err := s.m.DialPort(r.Context(), r.PathValue("id"), port)
	if err != nil {
		writeError(w, err)
		return
	}
	defer conn.Close()
	acceptBridge(w, r, func(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn) {
		go func() {
			defer cancel()
			for {
				_, msg, err := c.Read(ctx)
				if err != nil {
					conn.Close()
					return
				}
				if _, err := conn.Write(msg); err != nil {
					return
				}
			}
		}()
		buf := make([]byte, 32<<10)
		for {
			n, err := conn.Read(buf)
			if n > 0 && c.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
				return
			}
			if err != nil {
				c.Close(websocket.StatusNormalClosure, "closed")
				return
			}
		}
	})
}
