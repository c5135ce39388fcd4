package boot

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threadsAtNice lists this process's threads whose nice value is nice
// (/proc/self/task/*/stat, field 19).
func threadsAtNice(t *testing.T, nice int) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var tids []string
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended meanwhile
		}
		// The command name, in parentheses, may hold spaces: fields count
		// from after its closing parenthesis (field 3 is the first there).
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 16 {
			if n, err := strconv.Atoi(f[16]); err == nil && n == nice {
				tids = append(tids, filepath.Base(filepath.Dir(p)))
			}
		}
	}
	return tids
}

// TestPacketThreadNice: with ThreadNice set, each proxyDHCP reader and each
// TFTP poller runs on a thread of its own at that nice value while it
// serves, answers as before, and its thread is gone once Serve returns (the
// priority passes to no other goroutine). A positive value, which needs no
// privilege; as root a negative one too.
func TestPacketThreadNice(t *testing.T) {
	nices := []int{7}
	if os.Geteuid() == 0 {
		nices = append(nices, -7)
	}
	for _, nice := range nices {
		t.Run(strconv.Itoa(nice), func(t *testing.T) {
			if got := threadsAtNice(t, nice); len(got) != 0 {
				t.Fatalf("threads at nice %d before the servers start: %v", nice, got)
			}
			conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			h := &proxyHarness{conn: conn, events: &recorder{}}
			h.srv = &ProxyDHCP{ServerIP: testServerIP, URL: testURL, Table: tableOf(t, testMAC), Observer: h.events,
				Addr: "127.0.0.1:0", PXEAddr: "127.0.0.1:0", BroadcastAddr: conn.LocalAddr().(*net.UDPAddr).AddrPort(),
				ThreadNice: nice}
			if err := h.srv.Listen(); err != nil {
				t.Fatal(err)
			}
			h.dhcp, h.pxe = h.srv.Addrs()
			root := t.TempDir()
			if err := os.WriteFile(filepath.Join(root, "undionly.kpxe"), make([]byte, 4096), 0o644); err != nil {
				t.Fatal(err)
			}
			tftp := &TFTPServer{Addr: "127.0.0.1:0", Root: root, ThreadNice: nice}
			if err := tftp.Listen(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			dhcpDone, tftpDone := make(chan error, 1), make(chan error, 1)
			go func() { dhcpDone <- h.srv.Serve(ctx) }()
			go func() { tftpDone <- tftp.Serve(ctx) }()
			defer func() { cancel(); <-dhcpDone; <-tftpDone }()

			req := pxeRequest(t, testMAC, 0, "PXEClient:Arch:00000:UNDI:002001")
			reply, err := h.client(t, testMAC).SendAndRead(context.Background(), net.UDPAddrFromAddrPort(h.dhcp), req, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if reply.BootFileName != "undionly.kpxe" {
				t.Errorf("boot file %q", reply.BootFileName)
			}
			c := newRawTFTPClient(t)
			if n, err := c.get(tftp.LocalAddr(), "undionly.kpxe", 512); err != nil || n != 4096 {
				t.Fatalf("TFTP get: %d bytes, %v", n, err)
			}
			// Two readers (ports 67 and 4011) and the pollers.
			want := 2 + tftpPollers()
			if got := threadsAtNice(t, nice); len(got) != want {
				t.Errorf("%d threads at nice %d while serving (%v), want %d", len(got), nice, got, want)
			}

			cancel()
			for _, done := range []chan error{dhcpDone, tftpDone} {
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("Serve: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("Serve did not return after its context ended")
				}
				done <- nil
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(threadsAtNice(t, nice)) != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := threadsAtNice(t, nice); len(got) != 0 {
				for _, tid := range got {
					b, _ := os.ReadFile("/proc/self/task/" + tid + "/stat")
					st, _ := os.ReadFile("/proc/self/task/" + tid + "/stack")
					t.Logf("%s: %s %s", tid, b, st)
				}
				t.Errorf("threads still at nice %d after Serve returned: %v", nice, got)
			}
		})
	}
}
