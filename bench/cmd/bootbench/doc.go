// Command bootbench measures bcd's boot servers (boot.ProxyDHCP, boot.TFTPServer,
// boot.HTTPServer) against the programs they replace, side by side in one run on
// this machine: dnsmasq's proxyDHCP and TFTP, tftp-hpa's in.tftpd and nginx.
//
// Each server lives in a network namespace of its own, joined by a veth to one
// client namespace, so that every server is reached the same way a machine on the
// provisioning network reaches it and nothing touches the host's interfaces. bcd's
// servers run inside this process (bound in their namespace through
// testbed.Netns.Do); the peers run as processes under `ip netns exec`; the load
// comes from a child process of this program running in the client namespace, so
// that no client shares a Go runtime with a server. Every measurement takes a fixed
// time after a short warm-up, runs -runs times with the servers alternated, and the
// table shows medians with the spread and the ratios bcd/peer.
//
//	go run ./bench/cmd/bootbench [-only dhcp,tftp,http] [-duration 3s] [-runs 3] [-out bench/results]
//
// It needs root (namespaces, ports 67, 68, 69), dnsmasq, nginx and in.tftpd
// (bench/run.sh fetches tftp-hpa's binary without installing its service).
package main
