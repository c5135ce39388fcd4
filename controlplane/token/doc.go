// Package token mints and reads the two bearer secrets of the control plane:
// join tokens (bcjt_…) and operator tokens (bcop_…).
//
// A join token is bcjt_<id>_<secret>: the id (jt_ and a ULID) is public and
// names the store's record; the secret is 32 random bytes in lower-case base32.
// The store keeps only the SHA-256 of the secret, so a copy of the database
// holds no usable token, and a look-up by id followed by a constant-time
// comparison of hashes means a wrong secret takes as long to refuse as a right
// one takes to accept.
//
// An operator token is bcop_<secret>, 32 random bytes the same way; the store
// keeps its SHA-256 only.
package token
