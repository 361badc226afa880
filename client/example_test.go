package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/den-dev/den/api"
	"github.com/den-dev/den/client"
)

// A zero Client talks to the daemon named by $DEN_HOST, or to the local
// unix socket.
func Example() {
	var c client.Client
	ctx := context.Background()

	sb, err := c.Create(ctx, api.CreateRequest{
		Image:  "host",
		Labels: map[string]string{"task": "demo"},
		Limits: api.Limits{Memory: 512 << 20, CPUs: 1},
		TTL:    api.Duration(time.Hour),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, sb.ID, true)

	st, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"uname", "-a"}}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", st.ExitCode)
}

// Errors from the daemon are *api.Error values; errors.Is matches their
// kind against the sentinels of package api.
func Example_errors() {
	// A stand-in daemon that knows no sandboxes.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(api.ErrorDoc{Error: &api.Error{Kind: api.KindNotFound, Message: `no sandbox "web"`}})
	}))
	defer srv.Close()

	c := client.New("tcp://" + strings.TrimPrefix(srv.URL, "http://"))
	_, err := c.Get(context.Background(), "web")
	fmt.Println(err)
	fmt.Println(errors.Is(err, api.ErrNotFound))
	fmt.Println(api.KindOf(err))
	// Output:
	// no sandbox "web"
	// true
	// not_found
}

// Exec captures output; a command that ran and failed is not an error.
func ExampleClient_Exec() {
	// A stand-in daemon whose commands all print "hello" and exit 1.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.ExecResult{
			ExitStatus: api.ExitStatus{ExitCode: 1, Reason: api.ReasonExited},
			Stdout:     []byte("hello\n"),
		})
	}))
	defer srv.Close()

	c := &client.Client{Host: srv.URL, Token: "secret"}
	res, err := c.Exec(context.Background(), "web", api.ExecRequest{Shell: "echo hello; exit 1"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s%s %d\n", res.Stdout, res.Reason, res.ExitCode)
	// Output:
	// hello
	// exited 1
}

// ExecStream copies output as it arrives and reports how the command ended.
func ExampleClient_ExecStream() {
	c := client.New("unix:///run/den/den.sock")
	st, err := c.ExecStream(context.Background(), "web",
		api.ExecRequest{Cmd: []string{"make", "test"}, Timeout: api.Duration(10 * time.Minute)},
		os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	switch st.Reason {
	case api.ReasonExited:
		fmt.Println("exit code", st.ExitCode)
	case api.ReasonTimeout:
		fmt.Println("timed out after", st.Duration)
	default:
		fmt.Println(st.Reason, st.Signal, st.Error)
	}
}

// Files are written and read by path inside the sandbox.
func ExampleClient_WriteFile() {
	c := client.New("")
	ctx := context.Background()
	if _, err := c.WriteFile(ctx, "web", "/work/main.py", strings.NewReader("print(42)\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	r, err := c.ReadFile(ctx, "web", "/work/main.py")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	// ... read r
}

// Images are imported from an OCI archive or a `docker save` tarball.
func ExampleClient_ImportImage() {
	f, err := os.Open("alpine.tar")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	imgs, err := client.New("").ImportImage(context.Background(), "alpine:3.20", f, func(done, total int64, what string) {
		fmt.Fprintf(os.Stderr, "%s: %d/%d\n", what, done, total)
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, img := range imgs {
		fmt.Println(img.Name, img.ID)
	}
}

// A background process keeps running when the client leaves; its output is
// read later, or followed until it ends.
func ExampleClient_StartProcess() {
	c := client.New("")
	ctx := context.Background()
	p, err := c.StartProcess(ctx, "web", api.ExecRequest{Cmd: []string{"python3", "-m", "http.server", "8000"}})
	if err != nil {
		log.Fatal(err)
	}
	// ... later: the last 20 lines so far, then everything new until it ends.
	st, err := c.Logs(ctx, "web", p.ID, client.LogsOptions{Tail: 20, Follow: true}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ended:", st.Reason, st.ExitCode)
}

// A secret header gives a sandbox authenticated access to one HTTPS host
// without the secret entering the sandbox: den's proxy sets the header,
// expanding ${NAME} from den's secret store.
func ExampleClient_SetSecret() {
	var c client.Client
	ctx := context.Background()

	if err := c.SetSecret(ctx, "GITHUB_TOKEN", []byte(os.Getenv("GITHUB_TOKEN"))); err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, api.CreateRequest{Network: &api.NetworkPolicy{
		Mode:      api.NetAllow,
		Allow:     []string{"api.github.com"},
		MaxEgress: 100 << 20,
		SecretHeaders: []api.SecretHeader{
			{Host: "api.github.com", Header: "Authorization", Value: "Bearer ${GITHUB_TOKEN}"},
		},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, sb.ID, true)
	st, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"curl", "-s", "https://api.github.com/user"}}, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", st.ExitCode)
}
