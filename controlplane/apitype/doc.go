// Package apitype holds the control plane api's resource types: the bodies
// of its requests and answers, as the operator's client and CLI read and
// write them.
//
// They are written out field by field, apart from the store's records (as
// tailscale keeps client/tailscale/apitype apart from its server), for two
// reasons: a JSON tag or a new column in the store does not change the api
// by accident, and a program that only talks to the api (controlplane/client,
// the better-compute CLI) links none of the store or SQLite. The api
// (controlplane/api) converts store rows into these types in one place,
// where secrets are hidden and redacted.
//
// apitype imports protocol (the vocabulary shared with agents) and nothing
// of controlplane.
package apitype
