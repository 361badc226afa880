package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
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
	sid, err := s.m.PreviewAllowed(r.Context(), id, port, token)
	if err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("den_token") != "" {
		http.SetCookie(w, &http.Cookie{Name: cookie, Value: token, Path: prefix + "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(port)
			pr.Out.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, prefix), "/")
			pr.Out.URL.RawPath = ""
			q := pr.Out.URL.Query()
			q.Del("den_token")
			pr.Out.URL.RawQuery = q.Encode()
			pr.Out.Header.Del("X-Den-Token")
			pr.Out.Header.Del("Authorization")
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.m.DialPort(ctx, sid, port)
			},
			DisableCompression: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, api.Errorf(api.KindConflict, "preview of port %d: %v", port, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// PreviewHost routes requests for PORT-ID.DOMAIN to the preview proxy.
func (s *Server) PreviewHost(domain string, next http.Handler) http.Handler {
	suffix := "." + strings.ToLower(domain)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if domain == "" || !strings.HasSuffix(host, suffix) {
			next.ServeHTTP(w, r)
			return
		}
		portS, id, _ := strings.Cut(strings.TrimSuffix(host, suffix), "-")
		port, _ := strconv.Atoi(portS) // a bad port or id is refused like any other preview
		s.servePreview(w, r, id, port, "")
	})
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
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(api.MaxTTYMessage)
	// The pipes outlive a cancelled request context only until
	// closeWhenEnded has closed the connections with the reason.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	defer closeWhenEnded(r, c)()
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
}
