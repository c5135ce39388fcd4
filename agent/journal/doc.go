// Package journal is the agent's small durable store, a bbolt file under data_dir
// (journal.db, or [journal] path). It holds three things:
//
//   - the node id it belongs to, so that a journal left by another identity is never
//     replayed under this one ("the journal belongs to node <old>, not <new>");
//   - the statuses and events not yet acknowledged by the gateway, in sequence order,
//     so that a session can replay them after a reconnect or a restart;
//   - small state that must survive a restart, such as a pending node.reboot.
//
// The entries are bounded by [journal] max_entries: when the journal is full the
// oldest event goes first (a site agent's boot.nonce events after every other
// event, since a machine cannot join with a nonce the control plane never heard
// of), and only when no event is left the oldest status, since a command's final
// status is what the control plane waits for: a status never gives way to an event,
// so events appended to a journal that holds only statuses (and boot nonces) are
// refused with ErrFull (the site agent then answers a script request 503 rather
// than hand out a nonce the control plane may never hear of). Class
// indexes (idx_event, idx_nonce, idx_status: every outbox key by what is dropped
// first) make a drop one key lookup instead of a read of the outbox; a journal
// written before them is indexed when it opens.
//
// A journal that does not open (a torn or foreign file) is moved aside as
// journal.db.corrupt-<unix time> and a new one starts: the agent must come up, and
// what was lost is at worst a replay the gateway can ask for again.
package journal
