// Package human formats values for people reading an error or a timeline: a
// value quoted back cut to a readable length, a byte count in binary units. One
// copy each, so every message shortens and sizes the same way.
package human

import "fmt"

// DefaultShort is how much of a value Short keeps: enough to recognise it, not so
// much that a hostile or mistaken input floods a log line.
const DefaultShort = 64

// Short returns s cut to DefaultShort bytes, marked with "…" when cut.
func Short(s string) string { return ShortN(s, DefaultShort) }

// ShortN returns s cut to n bytes, marked with "…" when cut.
func ShortN(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Size formats n bytes in binary units: "512 B", "1.5 KiB", "2.0 GiB".
func Size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
