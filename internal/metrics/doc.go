// Package metrics serves Prometheus metrics for bcd site ([metrics] listen in
// config.toml) and better-compute serve (--metrics-listen): a registry with the
// Go and process collectors, an HTTP server that answers /metrics and nothing
// else, and Cached, a collector whose figures come from a query run at most
// once per interval (the store's machines by state).
//
// What each process exports is defined beside the code it counts
// (internal/metrics/sitemetrics, internal/metrics/cpmetrics). Counters the hot
// path already keeps (the boot servers' Stats) are read at scrape time, so a
// scrape costs the servers nothing and an unscraped endpoint costs nothing at
// all. Metric names start with bcd_site_ or better_compute_ and follow
// Prometheus' conventions: _total for counters, _seconds and _bytes for units.
package metrics
