// Package client is the operator's HTTP client for the control plane api,
// what the better-compute CLI's tokens, sites, nodes, commands and machines
// subcommands call. It speaks the api's resource types (apitype) and links
// none of the store: deps_test.go keeps it so. A refusal comes back as the
// server's *protocol.ErrorResponse, so the caller can print its code and
// message.
package client
