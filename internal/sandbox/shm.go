package sandbox

import "github.com/den-dev/den/api"

// minShmSize is the smallest /dev/shm den makes: below it, programs that
// use shared memory at all fail in ways that do not name the cause.
const minShmSize = 1 << 20

// maxShmSize bounds /dev/shm where the sandbox has no memory limit.
const maxShmSize = 64 << 30

// checkShmSize refuses a /dev/shm size (0 is the default, 64 MiB) under
// 1 MiB or over the sandbox's memory limit mem (its pages are the
// sandbox's memory, so more could never be used), or 64 GiB without one.
func checkShmSize(size, mem api.Size) error {
	switch {
	case size == 0:
		return nil
	case size < minShmSize:
		return api.FieldError("shm_size", "%s is less than 1m: ask for 1m or more, like 256m", size)
	case mem > 0 && size > mem:
		return api.FieldError("shm_size", "%s is more than the sandbox's memory limit %s (/dev/shm is memory): ask for less, or raise --memory", size, mem)
	case size > maxShmSize:
		return api.FieldError("shm_size", "%s is more than 64g", size)
	}
	return nil
}
