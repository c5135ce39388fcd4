// Package client is the operator's HTTP client for the control plane api,
// what the better-compute CLI's tokens, sites, nodes and commands
// subcommands call. A refusal comes back as the server's
// *protocol.ErrorResponse, so the caller can print its code and message.
package client
