package sandbox

import (
	"sync"
	"time"

	"github.com/den-dev/den/api"
)

// procCache keeps each sandbox's process list as its agent last gave it:
// attribution runs for every connection and query and must stay cheap,
// and a paused sandbox's list is what it was when it went to sleep.
type procCache struct {
	// mu guards lists.
	mu    sync.Mutex
	lists map[string]procList
}

// procList is one sandbox's process list and when it was read.
type procList struct {
	at    time.Time
	procs []api.ProcessInfo
}

// get is id's list, if one is kept.
func (c *procCache) get(id string) (procList, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.lists[id]
	return l, ok
}

// put keeps procs as id's list, read at at.
func (c *procCache) put(id string, procs []api.ProcessInfo, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lists == nil {
		c.lists = map[string]procList{}
	}
	c.lists[id] = procList{at, procs}
}

// drop forgets id's list.
func (c *procCache) drop(id string) {
	c.mu.Lock()
	delete(c.lists, id)
	c.mu.Unlock()
}
