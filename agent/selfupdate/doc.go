// Package selfupdate is bcd's self-update: verify a signed release, stage it, keep
// the A/B slots, swap, confirm on the first Welcome, swap back, roll back (spec
// "Self-update", steps 1–5).
//
// It is the privileged half: on a root node it runs in process, on an
// unprivileged one inside bcd helper. The caller (bcd node, bcd site, bcd update,
// bcd doctor) decides when; this package decides whether, and keeps the files:
//
//	<SlotsDir>/bcd-a, bcd-b       the two slots, mode 0755
//	<SlotsDir>/current, previous  relative symlinks to bcd-a or bcd-b
//	<SlotsDir>/slots.json         each slot's version, manifest sequence (0 =
//	                              unknown), SHA-256 and size of the bytes written
//	                              into it; mode 0644, like the binaries it describes
//	<RecordsDir>/upgrade.json     while an update awaits its first Welcome
//	<RecordsDir>/update.json      the release floor and the failed versions
//	<RecordsDir>/update.lock      one update at a time per host (flock)
//	<DataDir>/staging/bcd-<v>     the download, in a 0700 directory
//
// The slots directory is 0755 so that an unprivileged node could execute its
// slot; the records are 0600: they are root's on a helper node (spec: "run it as
// root on a helper node, whose records are root's"), and nothing but bcd reads
// them. Every record is written to a temporary file, fsynced, renamed and the
// directory fsynced, so a crash leaves the old record or the new one.
//
// The order of the writes is what makes a crash at any point recoverable:
// current is the commit point of a swap (upgrade.json is written before it, so a
// process that starts after the swap always finds the record), and a swap back
// moves current before it marks upgrade.json, so Resume can tell a swap back by
// where current points even when the mark was never written.
package selfupdate
