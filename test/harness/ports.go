package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Ports for components a test starts later (a webhook server, a metrics
// endpoint) are reserved, not just found free. A port that was merely free a
// moment ago can be taken before the component binds it: by the source port of
// any outgoing connection, or by another test package running beside this one.
// So reserved ports lie below the kernel's ephemeral range, which outgoing
// connections never use, and a lock file per port, held until the port is
// released, keeps every other test process from handing out the same one.
const (
	lowestTestPort = 20000
	reserveTries   = 200
)

// FreePort reserves a TCP port on 127.0.0.1 for a component of this test; it
// stays reserved until the test ends.
func FreePort(t testing.TB) int {
	t.Helper()
	port, release, err := reservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return port
}

// reservePort picks a port below the ephemeral range that no other test
// process holds and that nothing listens on, and locks it. release unlocks it.
func reservePort() (port int, release func(), err error) {
	dir := filepath.Join(os.TempDir(), "nodeguard-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, nil, err
	}
	top := ephemeralLow()
	for range reserveTries {
		port := lowestTestPort + rand.IntN(top-lowestTestPort)
		lock, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, nil, err
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			lock.Close() // another test process holds it
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			lock.Close() // something else listens there
			continue
		}
		l.Close()
		return port, func() { lock.Close() }, nil
	}
	return 0, nil, fmt.Errorf("no free TCP port in [%d, %d) after %d tries", lowestTestPort, top, reserveTries)
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low > lowestTestPort+1000 {
				return low
			}
		}
	}
	return 32768
}
