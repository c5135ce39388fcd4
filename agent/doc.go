// Package agent is what every bcd mode (node, site, ramdisk) shares: the identity a
// join leaves under data_dir, TLS pinned to the serving CA, the hardware claims, the
// boot id, logging, and the session client that keeps an outbound WebSocket to the
// gateway, runs the commands it receives and replays what the gateway has not yet
// acknowledged from the journal (agent/journal). The join client is agent/join.
//
// Files under data_dir:
//
//	node.key       PKCS#8 PEM, 0600: the node's P-256 key
//	identity.json  0600: node id, role, site, pool, SPIFFE id, certificate chain and
//	               trust bundle (PEM), gateway url and server name, when it joined
//	journal.db     the journal (or [journal] path)
//
// Nothing here listens on a network port: every connection an agent makes starts
// with it, outbound, and is checked against serving_ca_spki_pin. The join client
// and the session can reach the gateway through an HTTP proxy (ProxyDialer): a
// CONNECT tunnel that carries the TLS end to end, as the ramdisk does through its
// site agent (bcd.proxy).
package agent
