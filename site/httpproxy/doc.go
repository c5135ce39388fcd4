// Package httpproxy is the site agent's HTTP forward proxy for the provisioning
// network (the spec's http_proxy section): the only way a machine in the ramdisk
// reaches the gateway and the image servers.
//
// It forwards two things, and only to the host:port destinations it allows:
// CONNECT (TLS to the gateway, https:// images) and plain GET or HEAD of an
// absolute http:// URL (http:// images). Everything else, whatever the destination
// (other methods, origin-form requests, a destination not on the list), is refused
// with 403 before any connection leaves the site agent. Destinations are compared
// as written by the client, host lowercased and the port made explicit (80 for
// http://); the proxy resolves names itself, so a machine cannot pick an address.
//
// Connections are bounded (MaxConns: the rest wait in the kernel's accept queue),
// request headers must arrive within a timeout, and a tunnel or keep-alive
// connection that carries nothing for IdleTimeout is closed. The allowed list can
// be replaced while the proxy runs (SetAllowed); tunnels already open stay open.
package httpproxy
