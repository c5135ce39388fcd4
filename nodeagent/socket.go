package nodeagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/version"
)

// StatusPath is the status socket's one route (also served at /).
const StatusPath = "/v1/status"

// listenStatus binds the unix socket at path, 0600, or 0660 when a [helper] runs
// beside the node so the helper's group can read it. A stale socket (nobody answers)
// is removed; a live one, or anything that is not a socket, is refused rather than
// taken over. The directory is systemd's RuntimeDirectory (0700), which keeps the
// socket private in the moment between bind and chmod.
func listenStatus(path string, helper bool) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("status socket: %s exists and is not a socket; refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("status socket: another process serves %s (is bcd node already running?)", path)
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
	mode := os.FileMode(0o600)
	if helper {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("status socket: %w", err)
	}
	return ln, nil
}

func newStatusServer(n *Node) *http.Server {
	mux := http.NewServeMux()
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(n.status())
	}
	mux.HandleFunc("GET "+StatusPath, h)
	mux.HandleFunc("GET /{$}", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

func (n *Node) status() Status {
	st := n.session.State()
	state := st.NodeState
	if state == "" {
		state = "unknown"
	}
	return Status{
		NodeID:      n.id.NodeID,
		Role:        n.id.Role,
		Site:        n.id.Site,
		State:       state,
		Connected:   st.Connected,
		Gateway:     n.Config.GatewayURL,
		Version:     version.Version,
		BootID:      n.bootID,
		Pending:     st.Pending,
		LastWelcome: st.LastWelcome,
		LastError:   st.LastError,
	}
}
