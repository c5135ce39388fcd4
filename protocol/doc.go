// Package protocol defines the messages that cross between the agents (bcd node, site,
// ramdisk) and the control plane: the join request and its signed answer, the
// well-known bootstrap document, and the frames of a gateway session. Everything is
// JSON and versioned by ProtocolVersion; neither side sends a field the other has to
// guess the meaning of.
//
// A session is a WebSocket at {gateway}/v1/session over mutual TLS. Every WebSocket
// message is one Frame. The agent speaks first with Hello; the gateway answers with
// Welcome (which carries the desired state), then either side sends frames as they
// come: the gateway Spec and Command, the agent Status and Event. The gateway
// acknowledges each Status and Event by its sequence number (Ack) once it is stored,
// so an agent keeps them in its journal until then and replays them after a
// reconnect. Heartbeats are WebSocket pings both ways.
package protocol
