package sandbox

import (
	"runtime"
	"strings"

	"github.com/den-dev/den/api"
)

// Validation of create requests: names, labels, environment, limits.

// wordOK reports whether s has 1 to max bytes, starts with an ASCII letter
// or digit, and otherwise holds only letters, digits and bytes of extra.
// (Hand-written: bounded regexp repetitions cost milliseconds to compile
// at start-up, and every sandbox's init runs this binary too.)
func wordOK(s string, max int, extra string, lowerOnly bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z' && !lowerOnly:
		case i > 0 && strings.IndexByte(extra, c) >= 0:
		default:
			return false
		}
	}
	return true
}

func validName(s string) bool { return wordOK(s, 63, "_.-", false) }

func validLabelKey(s string) bool {
	last := s[len(s)-1:]
	return wordOK(s, 128, "_./-", false) && wordOK(last, 1, "", false)
}

func validEnv(kv string) bool {
	i := strings.IndexByte(kv, '=')
	return i > 0 && strings.IndexByte(kv, 0) < 0
}

func validateEnv(field string, env []string) error {
	if len(env) > 4096 {
		return api.FieldError(field, "more than 4096 variables")
	}
	for _, kv := range env {
		if len(kv) > api.MaxArgLen {
			return api.FieldError(field, "a variable of %d bytes (%.40q...); Linux takes at most %d per variable (MAX_ARG_STRLEN)", len(kv), kv, api.MaxArgLen)
		}
		if !validEnv(kv) {
			return api.FieldError(field, "%q is not KEY=VALUE", kv)
		}
	}
	if n := api.ArgBytes(env...); n > api.MaxArgTotal {
		return api.FieldError(field, "the variables take %d bytes; Linux takes at most %d for arguments and environment together (ARG_MAX)", n, api.MaxArgTotal)
	}
	return nil
}

func validateLimits(l api.Limits) error {
	if l.CPUs < 0 || l.CPUs > float64(runtime.NumCPU()) {
		return api.FieldError("limits.cpus", "%g is out of range: this host has %d CPUs", l.CPUs, runtime.NumCPU())
	}
	if l.CPUs > 0 && l.CPUs < 0.01 {
		return api.FieldError("limits.cpus", "%g is below the minimum of 0.01", l.CPUs)
	}
	if l.Memory != 0 && l.Memory < 8<<20 {
		return api.FieldError("limits.memory", "%s is below the minimum of 8m", l.Memory)
	}
	if l.Pids < 0 || l.Pids > 1<<22 {
		return api.FieldError("limits.pids", "%d is out of range", l.Pids)
	}
	if l.Pids > 0 && l.Pids < 4 {
		return api.FieldError("limits.pids", "%d is below the minimum of 4", l.Pids)
	}
	return nil
}

func validateCreate(req *api.CreateRequest) error {
	if req.Name != "" && !validName(req.Name) {
		return api.FieldError("name", "%q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", req.Name)
	}
	if len(req.Labels) > 64 {
		return api.FieldError("labels", "more than 64 labels")
	}
	for k, v := range req.Labels {
		if k == "" || !validLabelKey(k) {
			return api.FieldError("labels", "bad label key %q", k)
		}
		if len(v) > 255 || strings.ContainsRune(v, 0) {
			return api.FieldError("labels", "label %q: value longer than 255 bytes or with a NUL", k)
		}
	}
	if err := validateEnv("env", req.Env); err != nil {
		return err
	}
	if req.Workdir != "" && !strings.HasPrefix(req.Workdir, "/") {
		return api.FieldError("workdir", "%q is not an absolute path", req.Workdir)
	}
	if len(req.User) > 256 {
		return api.FieldError("user", "too long")
	}
	switch req.IdleAction {
	case "", api.IdleStop, api.IdlePause, api.IdleHibernate:
	default:
		return api.FieldError("idle_action", "%q: use stop, pause or hibernate", req.IdleAction)
	}
	if err := checkStopSignal(req.StopSignal); err != nil {
		return err
	}
	if err := checkStopTimeout("stop_timeout", req.StopTimeout); err != nil {
		return err
	}
	return validateLimits(req.Limits)
}
