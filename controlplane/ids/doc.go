// Package ids mints the identifiers the control plane hands out: node ids
// (n_…), join token ids (jt_…), command ids (cmd_…), machine ids (m_…) and
// deployment ids (dep_…).
//
// An id is a prefix and a ULID in lower-case Crockford base32: 26 characters,
// the first 10 a millisecond timestamp, the rest 80 random bits. Ids of one
// kind therefore sort by creation time, which keeps `nodes list` and the
// store's indexes in a useful order, and they stay within what
// protocol.ValidNodeID and a SPIFFE id path segment accept.
package ids
