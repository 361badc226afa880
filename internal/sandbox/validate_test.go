package sandbox

import (
	"strings"
	"testing"

	"github.com/den-dev/den/api"
)

func TestValidateCreate(t *testing.T) {
	good := []api.CreateRequest{
		{}, {Name: "a"}, {Name: "web-1.dev_x"}, {Labels: map[string]string{"team": "a", "k8s.io/name": "x"}},
		{Env: []string{"A=1", "B="}}, {Workdir: "/src"}, {Limits: api.Limits{Memory: 8 << 20, Pids: 4, CPUs: 0.5}},
	}
	for _, r := range good {
		if err := validateCreate(&r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := map[string]api.CreateRequest{
		"name":          {Name: "-x"},
		"name ":         {Name: "a b"},
		"name long":     {Name: strings.Repeat("a", 64)},
		"name slash":    {Name: "a/b"},
		"labels":        {Labels: map[string]string{"bad key": "x"}},
		"labels end":    {Labels: map[string]string{"key-": "x"}},
		"labels nul":    {Labels: map[string]string{"k": "a\x00"}},
		"env":           {Env: []string{"=x"}},
		"env noeq":      {Env: []string{"X"}},
		"workdir":       {Workdir: "rel"},
		"limits.memory": {Limits: api.Limits{Memory: 1 << 20}},
		"limits.pids":   {Limits: api.Limits{Pids: 2}},
		"limits.cpus":   {Limits: api.Limits{CPUs: 0.001}},
	}
	for name, r := range bad {
		err := validateCreate(&r)
		if err == nil {
			t.Errorf("%s: accepted %+v", name, r)
			continue
		}
		if f := strings.Fields(name)[0]; api.KindOf(err) != api.KindInvalid || err.(*api.Error).Field != f {
			t.Errorf("%s: error %v names field %q", name, err, err.(*api.Error).Field)
		}
	}
}

func TestNewImageName(t *testing.T) {
	for _, n := range []string{"ubuntu", "docker.io/library/ubuntu:24.04", "a@sha256:" + strings.Repeat("0", 64)} {
		if err := newImageName("name", n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	for _, n := range []string{"", "Ubuntu", "-x", "a b", strings.Repeat("a", 256), "a/../../c", "a//b", "host"} {
		if err := newImageName("name", n); api.KindOf(err) != api.KindInvalid || err.(*api.Error).Field != "name" {
			t.Errorf("%q: %v, want invalid naming name", n, err)
		}
	}
}

func TestCheckBuildTag(t *testing.T) {
	if err := checkBuildTag("app:v1"); err != nil {
		t.Fatalf("app:v1: %v", err)
	}
	for _, tag := range []string{cachePrefix + "x", "a/../b", "host"} {
		if err := checkBuildTag(tag); api.KindOf(err) != api.KindInvalid || err.(*api.Error).Field != "t" {
			t.Errorf("%q: %v, want invalid naming t", tag, err)
		}
	}
}

func FuzzValidName(f *testing.F) {
	for _, s := range []string{"a", "web-1", "-x", "a/b", "..", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if validName(s) {
			if strings.ContainsAny(s, "/ \x00") || s == "." || s == ".." || len(s) > 63 || s[0] == '-' || s[0] == '.' {
				t.Fatalf("accepted %q", s)
			}
		}
	})
}
