package store

import "context"

type priorityKey struct{}

// WithPriority marks the writes made with ctx as ahead of the others: a store
// whose writes queue (SQLite has one writer) serves them first, short of
// starving the rest. The gateway marks a site agent's session, whose one stream
// carries the boot events, boot nonces and BMC statuses of every machine of its
// site: waiting its turn behind each of those machines' own writes, it fell
// tens of seconds behind in a boot storm, and the ramdisks were refused
// NONCE_UNKNOWN meanwhile.
func WithPriority(ctx context.Context) context.Context {
	return context.WithValue(ctx, priorityKey{}, true)
}

// HasPriority says whether ctx was marked by WithPriority.
func HasPriority(ctx context.Context) bool {
	v, _ := ctx.Value(priorityKey{}).(bool)
	return v
}
