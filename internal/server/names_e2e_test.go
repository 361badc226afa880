package server_test

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

// Every endpoint that takes an image name refuses one that is not an image
// reference (`..`, empty components, spaces...) as invalid, naming the
// field, before it looks anything up or stores anything.
func TestImageNamesChecked(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, api.CreateRequest{})
	call := e.call(t)
	// Control: a good name passes the same routes (commit makes the image
	// that inspect, save and rm then find).
	if st, ae := call("POST", "/v1/sandboxes/"+sb.ID+"/commit", `{"name":"team/app:v1"}`); st != 201 && st != 200 {
		t.Fatalf("commit team/app:v1: %d %+v", st, ae)
	}
	if st, ae := call("GET", "/v1/images/team/app:v1", ""); st != 200 {
		t.Fatalf("inspect team/app:v1: %d %+v", st, ae)
	}
	for _, bad := range []string{"a/../../c", "../etc", "a//b", "a/./b", "a b", "UPPER/..", "a\\b"} {
		q := url.QueryEscape(bad)
		j, _ := json.Marshal(bad)
		for _, c := range []struct{ method, path, body, field string }{
			{"POST", "/v1/sandboxes", `{"image":` + string(j) + `}`, "image"},
			{"POST", "/v1/sandboxes/" + sb.ID + "/commit", `{"name":` + string(j) + `}`, "name"},
			{"POST", "/v1/images/import?name=" + q, "not a tar", "name"},
			{"POST", "/v1/images/pull", `{"ref":` + string(j) + `}`, "ref"},
			{"POST", "/v1/images/pull", `{"ref":"alpine","name":` + string(j) + `}`, "name"},
			{"POST", "/v1/images/build?t=" + q, "not a tar", "t"},
			{"GET", "/v1/images/" + url.PathEscape(bad), "", "image"},
			{"DELETE", "/v1/images/" + url.PathEscape(bad), "", "image"},
			{"GET", "/v1/images/save?name=" + q, "", "image"},
		} {
			st, ae := call(c.method, c.path, c.body)
			if st != 400 || ae == nil || ae.Kind != api.KindInvalid || ae.Field != c.field {
				t.Errorf("%s %s %s: %d %+v, want 400 invalid naming %s", c.method, c.path, c.body, st, ae, c.field)
			}
		}
	}
	imgs, err := e.c.Images(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range imgs {
		if strings.Contains(i.Name, "..") || strings.Contains(i.Name, "//") {
			t.Errorf("an image named %q was stored", i.Name)
		}
	}
}
