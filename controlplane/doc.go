// Package controlplane is `better-compute serve`: the api, the JoinService
// and the gateway in one process, on an embedded SQLite store in the data
// directory. Server wires them; the pieces live in the subpackages:
//
//	store      the Store interfaces, records and errors, no SQL;
//	           store/sqlite implements them (what serve runs on),
//	           store/storetest is the suite every implementation passes
//	join       the JoinService and its attestors (join-token, provisioned,
//	           discovery)
//	gateway    POST /v1/join and the /v1/session WebSockets
//	machines   machines.Service, the api's only way to change a machine
//	           (its spec; busy machines refuse); site agents' specs (boot,
//	           bmc_hosts, http_proxy), their machine.booted and boot.nonce
//	           events, a deploy's files
//	lifecycle  the machine lifecycle: the state machine from machines
//	           deploy to provisioned or failed, run by a controller in
//	           serve (timeouts: --lifecycle-timeouts); the only writer of a
//	           machine's status, which adopts the JoinService's bindings
//	api        /.well-known/better-compute, downloads, the operator api
//	apitype    the api's resource types, apart from the store's rows
//	refusal    domain refusals (code, message); httpjson maps them to HTTP
//	           at the api and gateway edges
//	downloads  the release binaries route
//	client     the operator's api client (the CLI uses it)
//	token, ids the bcjt_/bcop_ secrets and the n_/jt_/cmd_/m_ ids
//
// Two HTTPS listeners: the api (default 127.0.0.1:8443) and the gateway
// (default 127.0.0.1:8444), which also asks agents for their client
// certificate. Both present a serving certificate the server issues itself
// from the bundle's serving CA for the hosts it serves (listen hosts, the
// gateway URL's host and server name, localhost, 127.0.0.1 and ::1), chain
// [leaf, serving CA] so agents can match the CA against their pin; it is
// reissued before it expires. --tls-cert and --tls-key replace it.
//
// At its first start on a data directory the server creates the operator
// token (bcop_…): it prints it once, or writes it to OperatorTokenFile
// (0600), and keeps only its hash. Later starts neither print nor write it.
package controlplane
