package boot_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os/signal"
	"sync"
	"syscall"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// Example wires the three servers the way bcd site does from [boot]: one table, one
// observer, the ramdisk parameters from the site's configuration.
func Example() {
	var table boot.MemTable // replaced whole whenever the control plane sends boot entries
	_ = table.Set(map[string]boot.Entry{"52:54:00:12:34:56": {Mode: boot.ModeRamdisk}})
	observer := boot.ObserverFunc(func(e boot.Event) {
		slog.Info("machine served", "what", e.Served, "mac", e.MAC, "ip", e.IP, "nonce_minted", e.Nonce != "")
	})
	minter := boot.NonceMinterFunc(func(mac net.HardwareAddr) (string, error) {
		return protocol.NewBootNonce() // the site agent also records it for the control plane
	})
	dhcp := &boot.ProxyDHCP{
		Interface: "eno1",
		ServerIP:  netip.MustParseAddr("10.20.0.2"),
		URL:       "http://10.20.0.2:8080",
		Table:     &table,
		Observer:  observer,
	}
	tftp := &boot.TFTPServer{Addr: ":69", Root: "/srv/bcd/ipxe", Observer: observer}
	web := &boot.HTTPServer{
		Addr:  "0.0.0.0:8080",
		URL:   "http://10.20.0.2:8080",
		Table: &table,
		Params: ipxe.Params{
			GatewayURL:        "https://gw.eu.example.com",
			ServerName:        "gw.eu.example.com",
			Site:              "site_01k5w",
			ServingCAPin:      "sha256/…",
			JoinSigningPin:    "sha256/…",
			JoinEncryptionPin: "sha256/…",
		},
		Kernel:     "http://10.20.0.2:8080/ramdisk/vmlinuz",
		Initrd:     "http://10.20.0.2:8080/ramdisk/initrd",
		Cmdline:    "console=ttyS0,115200",
		RamdiskDir: "/srv/bcd/ramdisk",
		BinDir:     "/srv/bcd/ipxe",
		Nonces:     minter,
		Observer:   observer,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var wg sync.WaitGroup
	for _, serve := range []func(context.Context) error{dhcp.ListenAndServe, tftp.ListenAndServe, web.ListenAndServe} {
		wg.Go(func() {
			if err := serve(ctx); err != nil {
				slog.Error("boot server stopped", "err", err)
				stop() // one down takes the others down: bcd site exits and its unit restarts it
			}
		})
	}
	wg.Wait()
}
