// Package gateway is the agents' side of the control plane: POST /v1/join,
// relayed to the JoinService, and GET /v1/session, the WebSocket every
// joined agent keeps open.
//
// # Sessions
//
// A session runs over mutual TLS. The listener asks for a client certificate
// without requiring one (so /v1/join works on the same port); /v1/session
// then verifies it against the node CA and refuses a missing or invalid one
// with 401 (UNAUTHENTICATED), and a node that is unknown, deleted, or whose
// certificate a later join replaced with 403 (NODE_REVOKED).
//
// Every WebSocket message is one protocol.Frame as JSON text. The agent's
// first frame must be Hello, within HelloTimeout, naming the node id and
// role of its certificate's SPIFFE id; anything else ends the session with
// an Error frame and close code 1008. The gateway then records the session
// (node_sessions), makes it the node's only one (an older session of the
// same node is closed), and answers Welcome{server_time,
// min_protocol_version, upgrade_required, node_state, spec}.
//
// Node state: a node is adopting from its join until the gateway has written
// a Welcome to it. The Welcome of that first session still says adopting
// (it is the adoption); once it is written the node is ready, and every
// later Welcome says ready. A reclaim (a new join of the same node) makes it
// adopting again. Whether a node is connected is kept apart from its state:
// nodes.session_id names the open session.
//
// The Welcome's spec comes from Specs; SpecChanged(site) makes the sessions
// of that site's site agents build it again and send it (a spec frame) when
// its revision grew. Events goes over every event before it is stored
// (machine.booted attached to a machine, boot.nonce kept hashed and stored
// without the nonce).
//
// After the Welcome the gateway sends the node's open commands, and any
// command enqueued while the node is connected (Notify). A queued command is
// sent at once. One an earlier session sent without an answer is re-sent on
// every new session until a status arrives, but only ResendDelay (2 s) after
// the Welcome, so that the statuses the agent's journal replays are stored
// first. One the agent reported RUNNING is never sent again: the agent has
// it, and its journal reports the rest, so a deploy that finished while the
// gateway was away does not run twice. Each Status updates its command and
// each Event is stored; both are acknowledged with Ack{seq} once written, so
// the agent can drop them from its journal. Observer (the lifecycle
// controller) is told about every stored status and every session that
// opens (after its Welcome) or closes.
//
// Heartbeats: the gateway pings every PingInterval (15 s) and drops a
// session that misses MissedPings (3) pongs in a row. A session costs two
// goroutines (the handler, reading, and one writer), small buffers, and one
// store write per frame; see BenchmarkSessions for the measured memory.
package gateway
