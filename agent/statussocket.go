package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/internal/version"
)

// ListenStatusSocket binds an agent's status socket (socket_path) at path with mode
// (0600, or 0660 where a helper's group must read it). A stale socket (nobody
// answers) is removed; a live one, or anything that is not a socket, is refused
// rather than taken over. The directory is systemd's RuntimeDirectory (0700), which
// keeps the socket private in the moment between bind and chmod.
func ListenStatusSocket(path string, mode os.FileMode) (net.Listener, error) {
	// A directory others may write in would let them replace the socket with
	// their own between bind and use; it is refused, not repaired.
	if err := secretfile.CheckDir(filepath.Dir(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("status socket: %s exists and is not a socket; refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("status socket: another process serves %s (is a bcd agent already running with this config?)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("status socket: remove the stale %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("status socket: %w", err)
	}
	return ln, nil
}

// SessionStatus is what every agent's status socket says of its identity and its
// session with the gateway; bcd node's and bcd site's answers embed it.
type SessionStatus struct {
	NodeID string `json:"node_id"`
	Role   string `json:"role"`
	Site   string `json:"site,omitempty"`
	// State is the agent's state as the gateway last said (adopting, ready,
	// cordoned…), or "unknown" before the first Welcome.
	State       string    `json:"state"`
	Connected   bool      `json:"connected"`
	Gateway     string    `json:"gateway"`
	Version     string    `json:"version"`
	BootID      string    `json:"boot_id"`
	Pending     int       `json:"pending"`
	LastWelcome time.Time `json:"last_welcome,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	// CertNotAfter is the node certificate's expiry; Renewal is "" while its
	// renewal is well, "refused: CODE: message" or "failing: error" otherwise,
	// and NextRenewal when the next attempt is due.
	CertNotAfter time.Time `json:"cert_not_after,omitzero"`
	Renewal      string    `json:"renewal,omitempty"`
	NextRenewal  time.Time `json:"next_renewal,omitzero"`
}

// WithRenewal adds the renewal's state to the status.
func (s SessionStatus) WithRenewal(r RenewalStatus) SessionStatus {
	s.CertNotAfter, s.Renewal, s.NextRenewal = r.NotAfter, r.State, r.Next
	return s
}

// NewSessionStatus is the status of an agent with identity id, in site, talking
// to gateway since boot bootID, whose session is st.
func NewSessionStatus(id *Identity, site, gateway, bootID string, st SessionState) SessionStatus {
	state := st.NodeState
	if state == "" {
		state = "unknown"
	}
	return SessionStatus{
		NodeID: id.NodeID, Role: id.Role, Site: site, State: state, Connected: st.Connected,
		Gateway: gateway, Version: version.Version, BootID: bootID, Pending: st.Pending,
		LastWelcome: st.LastWelcome, LastError: st.LastError, CertNotAfter: id.Leaf().NotAfter,
	}
}
