package main

import (
	"context"
	"testing"

	"github.com/den-dev/den/api"
)

// den exec --session keeps each argument of a command as it is: only a
// single argument is a shell line.
func TestSessionKeepsQuoting(t *testing.T) {
	d := newDaemon(t)
	sb, err := d.c.Create(context.Background(), api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cd /tmp && export GREETING=hi"}, ""},
		{[]string{"sh", "-c", `echo "a b"`}, "a b\n"},
		{[]string{"echo", "$GREETING", "x  y", "|", "cat"}, "$GREETING x  y | cat\n"},
		{[]string{"pwd; echo $GREETING"}, "/tmp\nhi\n"},
	} {
		out, err := d.cli(0, append([]string{"exec", "--session", "s", sb.ID, "--"}, tc.args...)...)
		if err != nil || out != tc.want {
			t.Fatalf("den exec --session s ID -- %q: %q %v, want %q", tc.args, out, err, tc.want)
		}
	}
}
