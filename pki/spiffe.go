package pki

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// DefaultTrustDomain is the trust domain of a bundle made without one.
const DefaultTrustDomain = "better-compute.local"

const spiffeScheme = "spiffe://"

var (
	nodeIDRE = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	// A DNS label in lower case: SPIFFE trust domains are case-sensitive
	// strings, so upper case is refused rather than folded.
	dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidateTrustDomain checks that td is a lower-case DNS name: it is the host
// of every SPIFFE ID and the URI name constraint of the node CA.
func ValidateTrustDomain(td string) error {
	if td == "" || len(td) > 253 {
		return fmt.Errorf("trust domain %q: want a DNS name of 1 to 253 characters", human.ShortN(td, 80))
	}
	for _, l := range strings.Split(td, ".") {
		if !dnsLabelRE.MatchString(l) {
			return fmt.Errorf("trust domain %q: want a lower-case DNS name (labels of a-z, 0-9 and inner -)", human.ShortN(td, 80))
		}
	}
	return nil
}

// ValidateRole accepts the roles a node certificate can carry: node, site
// and ramdisk (protocol.ValidRole).
func ValidateRole(role string) error {
	if protocol.ValidRole(role) {
		return nil
	}
	return fmt.Errorf("role %q: want node, site or ramdisk", human.ShortN(role, 80))
}

// ValidateNodeID accepts 1 to 64 characters of [a-z0-9_-]: a node ID becomes a
// path segment of a URI and a file and log name, so it is kept plain.
func ValidateNodeID(id string) error {
	if !nodeIDRE.MatchString(id) {
		return fmt.Errorf("node id %q: want 1 to 64 characters of a-z, 0-9, _ and -", human.ShortN(id, 80))
	}
	return nil
}

// SPIFFEID returns spiffe://<trust-domain>/<role>/<node-id>. It does not
// validate; ParseSPIFFEID and IssueNodeCert do.
func SPIFFEID(trustDomain, role, nodeID string) string {
	return spiffeScheme + trustDomain + "/" + role + "/" + nodeID
}

// ParseSPIFFEID splits a node's SPIFFE ID into its parts, accepting only the
// exact form SPIFFEID makes: no port, user, query, fragment, extra segments or
// escapes, so that one identity has exactly one spelling.
func ParseSPIFFEID(uri string) (trustDomain, role, nodeID string, err error) {
	rest, ok := strings.CutPrefix(uri, spiffeScheme)
	if !ok {
		return "", "", "", fmt.Errorf("SPIFFE ID %q: want %s<trust-domain>/<role>/<node-id>", human.ShortN(uri, 80), spiffeScheme)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("SPIFFE ID %q: want %s<trust-domain>/<role>/<node-id>", human.ShortN(uri, 80), spiffeScheme)
	}
	if err := ValidateTrustDomain(parts[0]); err != nil {
		return "", "", "", fmt.Errorf("SPIFFE ID: %w", err)
	}
	if err := ValidateRole(parts[1]); err != nil {
		return "", "", "", fmt.Errorf("SPIFFE ID: %w", err)
	}
	if err := ValidateNodeID(parts[2]); err != nil {
		return "", "", "", fmt.Errorf("SPIFFE ID: %w", err)
	}
	return parts[0], parts[1], parts[2], nil
}

// short keeps error messages readable when the input is long or hostile.
