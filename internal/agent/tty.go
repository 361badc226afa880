package agent

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/coder/websocket"

	"github.com/den-dev/den/api"
)

// handleTTY attaches a WebSocket to a process started with a terminal.
// Binary messages are keystrokes; text messages are TTYControl JSON. The
// agent sends the retained screen output, then output as it comes (binary),
// and a final text message {"exit": ExitStatus} when the process ends.
// Several clients may attach at once; leaving never stops the process.
func (a *Agent) handleTTY(w http.ResponseWriter, r *http.Request) {
	p := a.proc(w, r)
	if p == nil {
		return
	}
	if !p.tty {
		WriteError(w, api.Errorf(api.KindConflict, "process %s was not started with a terminal (tty)", p.ID))
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(api.MaxTTYMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	cur := p.stdout.Attach(0, false)
	defer p.stdout.Detach(cur)
	go func() {
		defer cancel()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				p.stdinMu.Lock()
				if !p.stdinClosed.Load() && p.stdinW != nil {
					p.stdinW.Write(msg)
				}
				p.stdinMu.Unlock()
				continue
			}
			var ctl api.TTYControl
			if json.Unmarshal(msg, &ctl) != nil {
				continue // garbage is ignored, never fatal
			}
			if ctl.Resize != nil && ctl.Resize.Rows > 0 && ctl.Resize.Cols > 0 {
				p.Resize(ctl.Resize.Rows, ctl.Resize.Cols)
			}
			if ctl.Signal != "" {
				if sig, err := ParseSignal(ctl.Signal); err == nil {
					p.Signal(sig)
				}
			}
		}
	}()
	go func() { <-ctx.Done(); p.stdout.Detach(cur) }()
	buf := make([]byte, 32<<10)
	for {
		n, _, done, err := p.stdout.Read(cur, buf)
		if err != nil {
			return // the client left
		}
		if n > 0 {
			if c.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
				return
			}
		}
		if done {
			break
		}
	}
	<-p.Done()
	st := p.Status()
	b, _ := json.Marshal(api.TTYControl{Exit: &st})
	c.Write(ctx, websocket.MessageText, b)
	c.Close(websocket.StatusNormalClosure, "exited")
}
