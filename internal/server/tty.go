package server

import (
	"context"
	"net/http"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/internal/agent"
)

// tty bridges a client's WebSocket to the agent's terminal WebSocket of a
// process, message for message. Messages are bounded in size; anything the
// agent does not understand it ignores, so garbage or floods from either
// side end at most this one connection.
func (s *Server) tty(w http.ResponseWriter, r *http.Request) {
	proc := r.PathValue("proc")
	if !agent.ValidProcRef(proc) {
		writeError(w, noProcess(proc))
		return
	}
	ag, _, err := s.m.Agent(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	// Check the process first, so a bad id is a JSON error, not a failed upgrade.
	if err := ag.JSON(r.Context(), "GET", agent.ProcPath(proc, ""), nil, nil, nil); err != nil {
		writeError(w, err)
		return
	}
	up, _, err := websocket.Dial(r.Context(), "ws://agent"+agent.ProcPath(proc, agent.ProcTTY), &websocket.DialOptions{HTTPClient: ag.HTTP()})
	if err != nil {
		writeError(w, api.Errorf(api.KindConflict, "attach to %s: %v", proc, err))
		return
	}
	defer up.CloseNow()
	up.SetReadLimit(api.MaxTTYMessage + 1024)
	acceptBridge(w, r, func(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn) {
		pipe := func(from, to *websocket.Conn) {
			defer cancel()
			for {
				typ, msg, err := from.Read(ctx)
				if err != nil {
					if st := websocket.CloseStatus(err); st != -1 {
						to.Close(st, "")
					}
					return
				}
				if err := to.Write(ctx, typ, msg); err != nil {
					return
				}
			}
		}
		go pipe(c, up)
		pipe(up, c)
	}, up)
}
