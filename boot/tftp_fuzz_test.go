package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzTFTPPath: whatever name a client asks for, the server either refuses it or
// sends a regular file from inside the root, and never blocks (the root holds a
// FIFO) or reads the file beside the root.
func FuzzTFTPPath(f *testing.F) {
	for _, name := range []string{"undionly.kpxe", "sub/snponly.efi", "inside-link", "../secret", "escape",
		"absolute-link", "fifo", "null", "sub", "/etc/passwd", "autoexec.ipxe", "sub/../undionly.kpxe", "a\\b"} {
		f.Add(name)
	}
	root, files := tftpRoot(f)
	s := &TFTPServer{Addr: "127.0.0.1:0", Root: root}
	if err := s.Listen(); err != nil {
		f.Fatal(err)
	}
	defer s.conn.Close()
	secret, err := os.ReadFile(filepath.Join(filepath.Dir(root), "secret"))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		done := make(chan struct{})
		var got *tftpFile
		var err error
		go func() {
			defer close(done)
			got, err = s.open(name)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("open(%q) blocks", name)
		}
		if err != nil {
			if !errors.Is(err, errTFTPNotFound) && !errors.Is(err, errTFTPAccess) {
				t.Fatalf("open(%q): unexpected error %v", name, err)
			}
			return
		}
		data := make([]byte, got.size)
		if err := got.readAt(data, 0); err != nil {
			t.Fatalf("open(%q): reading: %v", name, err)
		}
		got.release()
		if bytes.Equal(data, secret) {
			t.Fatalf("open(%q) read the file outside the root", name)
		}
		clean, cerr := cleanTFTPPath(name)
		if cerr != nil || strings.HasPrefix(clean, "/") || strings.Contains("/"+clean+"/", "/../") {
			t.Fatalf("open(%q) succeeded for a name cleanTFTPPath refuses", name)
		}
		for _, b := range files {
			if bytes.Equal(b, data) {
				return
			}
		}
		t.Fatalf("open(%q) returned %d bytes that are none of the root's files", name, len(data))
	})
}

// FuzzTFTPRequest throws arbitrary datagrams at a running server (parseTFTPRequest
// and the option negotiation take them) and checks after each that it still answers.
func FuzzTFTPRequest(f *testing.F) {
	rrq := func(name string, opts ...string) []byte {
		b := append([]byte{0, 1}, name...)
		b = append(b, "\x00octet\x00"...)
		for _, o := range opts {
			b = append(append(b, o...), 0)
		}
		return b
	}
	f.Add(rrq("undionly.kpxe", "blksize", "1468", "tsize", "0"))
	f.Add(rrq("autoexec.ipxe"))
	f.Add(rrq("../secret", "blksize", "99999999999999999999"))
	f.Add([]byte{0, 2, 'x', 0, 'o', 'c', 't', 'e', 't', 0})
	f.Add([]byte{0, 4, 0, 1})
	f.Add([]byte{0, 5, 0, 1, 'e', 0})
	f.Add([]byte{0, 6, 'b', 'l', 'k', 's', 'i', 'z', 'e', 0})
	f.Add([]byte{0, 1})
	root, _ := tftpRoot(f)
	_, addr := startTFTP(f, root, func(s *TFTPServer) {
		s.Timeout = 10 * time.Millisecond
		s.Retries = 1
		s.MaxTransfers = 1000
	})
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		f.Fatal(err)
	}
	defer probe.Close()
	buf := make([]byte, 1500)
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := c.Write(b); err != nil {
			t.Skip(err) // oversized datagram
		}
		if _, err := probe.WriteToUDPAddrPort(rrq("not-there"), addr); err != nil {
			t.Fatal(err)
		}
		probe.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := probe.ReadFromUDPAddrPort(buf)
		if err != nil || n < 4 || binary.BigEndian.Uint16(buf) != 5 {
			t.Fatalf("server stopped answering after %q: %v", b, err)
		}
	})
}
