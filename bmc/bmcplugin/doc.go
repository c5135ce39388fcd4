// Package bmcplugin carries the bmc.Driver interface between bcd and a driver plugin
// (bcx-ipmi) over hashicorp/go-plugin's gRPC: the handshake both sides share, the
// plugin map, and the client and server adapters. It is the only package that
// knows the wire; both sides see a plain bmc.Driver.
//
// The service is described by hand (a grpc.ServiceDesc) and its messages travel as
// JSON through a registered codec, so the repository needs no protoc and no
// generated code: the messages are a handful of small structs, and gRPC's framing,
// deadlines and go-plugin's process handling are what matter here, not protobuf's
// encoding. go-plugin's own services (health, broker, stdio) keep protobuf.
//
// An error crosses the channel as a gRPC status whose trailer carries its bmc.Kind,
// so the host can tell a BMC that refused a password from a plugin that died. The
// plugin runs each call against a deadline a little before the caller's (a tenth
// of the time left, at most a second): a working plugin always answers, if only to
// say the BMC was too slow, so a caller whose own deadline passes knows the plugin
// hung.
package bmcplugin
