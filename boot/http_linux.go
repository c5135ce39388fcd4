package boot

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// setCork sets TCP_CORK on c, a TCP connection; it reports whether it could.
// While corked, the kernel sends only full segments; clearing it sends what is
// queued.
func setCork(c net.Conn, on bool) bool {
	v := 0
	if on {
		v = 1
	}
	return setTCPOpt(c, unix.TCP_CORK, v)
}

// setNotsentLowat sets TCP_NOTSENT_LOWAT on c: the kernel takes more of a
// download only while less than v bytes of it are unsent (0: the default).
func setNotsentLowat(c net.Conn, v int) { setTCPOpt(c, unix.TCP_NOTSENT_LOWAT, v) }

func setTCPOpt(c net.Conn, opt, v int) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, opt, v)
	}); err != nil {
		return false
	}
	return serr == nil
}

// httpUnsentBudget is how much unsent file data the downloads may queue in the
// kernel together: a quarter of the TCP memory at which the kernel starts
// pressing sockets (net.ipv4.tcp_mem's middle value, 1.5 GiB on a 24 GiB
// host), so that a boot storm stays clear of it with room for everything else.
var httpUnsentBudget = sync.OnceValue(func() int64 {
	const fallback = 256 << 20
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_mem")
	if err != nil {
		return fallback
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return fallback
	}
	pressure, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || pressure <= 0 {
		return fallback
	}
	return pressure * int64(os.Getpagesize()) / 4
})
