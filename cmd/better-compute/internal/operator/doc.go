// Package operator is the better-compute binary's operator CLI: every
// subcommand but serve (tokens, sites, nodes, commands, machines, images, pki,
// release, daemon, version), one file per subcommand.
//
// It lives apart from package main so that what it links can be checked:
// it talks to the control plane through controlplane/client and the api's
// resource types (apitype) only, never the store, and deps_test.go fails if
// SQLite or the store come back. main adds serve, which runs the control
// plane (and so links the store), to the root this package builds.
//
// It is not named cli because internal/cli is the cobra glue both binaries
// share (Run, exit codes, argument checks), which every file here imports.
package operator
