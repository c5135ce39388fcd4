// Package agenttest is a small in-process gateway for the agent's tests: a TLS server
// on 127.0.0.1 whose certificate chain is [leaf, serving CA] from a PKI bundle made
// in the test's temporary directory, answering POST /v1/join like the JoinService
// (open the sealed token, or match a boot nonce to the claims' MACs for the
// discovery attestor; issue a node certificate, sign the result) and GET
// /v1/session as a WebSocket the test drives frame by frame. It is not the control
// plane: it knows only what the tests need, and lets them break each rule on purpose.
package agenttest
