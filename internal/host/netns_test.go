package host

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "ns", "net")
	if err := CreateNetNS(p); err != nil {
		t.Fatal(err)
	}
	defer RemoveNetNS(p)
	if ok, err := isNetNS(p); !ok {
		t.Fatalf("%s is not a network namespace: %v", p, err)
	}
	ns, err := netns.GetFromPath(p)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	self, _ := netns.Get()
	defer self.Close()
	if ns.Equal(self) {
		t.Fatal("the pinned namespace is the test's own")
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, _ := h.LinkList()
	if len(links) != 1 || links[0].Attrs().Name != "lo" || links[0].Attrs().Flags&1 == 0 {
		t.Fatalf("links in the new namespace: %v (want lo, up)", links)
	}
	// Creating again keeps the same namespace.
	if err := CreateNetNS(p); err != nil {
		t.Fatal(err)
	}
	again, _ := netns.GetFromPath(p)
	defer again.Close()
	if !again.Equal(ns) {
		t.Fatal("CreateNetNS replaced a pinned namespace")
	}
	if err := RemoveNetNS(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", p, err)
	}
	if err := RemoveNetNS(p); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}
