package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseProxyURL(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"http://10.20.0.2:3128", "http://10.20.0.2:3128", ""},
		{"http://10.20.0.2:3128/", "http://10.20.0.2:3128", ""},
		{"http://[fd00::2]:3128", "http://[fd00::2]:3128", ""},
		{"http://proxy.site:8080", "http://proxy.site:8080", ""},
		{"https://10.20.0.2:3128", "", "want http://host:port"},
		{"http://10.20.0.2", "", "no port"},
		{"http://:3128", "", "no host"},
		{"http://u:p@10.20.0.2:3128", "", "user name"},
		{"http://10.20.0.2:3128/x", "", "no path"},
		{"http://10.20.0.2:3128?x", "", "no path"},
		{"http://10.20.0.2:0", "", "not a port"},
		{"10.20.0.2:3128", "", "want http://host:port"},
	} {
		u, err := ParseProxyURL(tc.in)
		switch {
		case tc.err == "" && (err != nil || u.String() != tc.want):
			t.Errorf("%q: %v %v, want %s", tc.in, u, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.err)
		}
	}
}

// fakeProxy answers one CONNECT with answer, then writes early (bytes the server
// sends before the client speaks) and echoes what it reads.
func fakeProxy(t *testing.T, answer, early string) (*url.URL, chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	reqs := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		reqs <- strings.TrimSpace(line)
		for {
			l, err := br.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		if answer == "" {
			time.Sleep(time.Second)
			return
		}
		io.WriteString(c, answer+early)
		io.Copy(c, br)
	}()
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}, reqs
}

func TestProxyDialerTunnels(t *testing.T) {
	u, reqs := fakeProxy(t, "HTTP/1.1 200 Connection established\r\n\r\n", "early")
	conn, err := ProxyDialer(u, nil)(context.Background(), "tcp", "127.0.0.1:8443")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := <-reqs; got != "CONNECT 127.0.0.1:8443 HTTP/1.1" {
		t.Fatalf("request line %q", got)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "early" {
		t.Fatalf("early bytes %q: %v", buf, err)
	}
	io.WriteString(conn, "ping")
	if _, err := io.ReadFull(conn, buf[:4]); err != nil || string(buf[:4]) != "ping" {
		t.Fatalf("echo %q: %v", buf[:4], err)
	}
}

func TestProxyDialerRefusalsAndTimeouts(t *testing.T) {
	u, _ := fakeProxy(t, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", "")
	if _, err := ProxyDialer(u, nil)(context.Background(), "tcp", "127.0.0.1:8443"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("403: %v", err)
	}
	u, _ = fakeProxy(t, "", "") // says nothing
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ProxyDialer(u, nil)(ctx, "tcp", "127.0.0.1:8443")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("silent proxy: %v after %s", err, time.Since(start))
	}
}

// TestProxyFor: an explicit proxy wins; otherwise HTTPS_PROXY and NO_PROXY decide, as
// for every other client on the host; loopback is never proxied.
func TestProxyFor(t *testing.T) {
	explicit, _ := ParseProxyURL("http://10.0.0.9:3128")
	for _, tc := range []struct {
		name, httpsProxy, noProxy, target string
		explicit                          bool
		want                              string
	}{
		{name: "explicit", httpsProxy: "http://10.0.0.1:3128", target: "https://10.10.0.1:8444", explicit: true, want: "http://10.0.0.9:3128"},
		{name: "environment", httpsProxy: "http://10.20.0.2:3128", target: "https://10.10.0.1:8444", want: "http://10.20.0.2:3128"},
		{name: "no proxy", httpsProxy: "http://10.20.0.2:3128", noProxy: "10.10.0.1", target: "https://10.10.0.1:8444", want: ""},
		{name: "none set", target: "https://10.10.0.1:8444", want: ""},
		{name: "loopback", httpsProxy: "http://10.20.0.2:3128", target: "https://127.0.0.1:8444", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "REQUEST_METHOD"} {
				t.Setenv(k, "")
			}
			t.Setenv("HTTPS_PROXY", tc.httpsProxy)
			t.Setenv("NO_PROXY", tc.noProxy)
			var e *url.URL
			if tc.explicit {
				e = explicit
			}
			got, err := ProxyFor(e, tc.target)
			if err != nil {
				t.Fatal(err)
			}
			if s := fmt.Sprint(got); (got == nil && tc.want != "") || (got != nil && s != tc.want) {
				t.Errorf("ProxyFor = %v, want %q", got, tc.want)
			}
		})
	}
}
