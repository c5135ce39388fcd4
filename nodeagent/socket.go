package nodeagent

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/better-compute/bcd/agent"
)

// StatusPath is the status socket's one route (also served at /).
const StatusPath = "/v1/status"

// listenStatus binds the status socket: 0600, or 0660 when a [helper] runs beside
// the node so the helper's group can read it.
func listenStatus(path string, helper bool) (net.Listener, error) {
	mode := os.FileMode(0o600)
	if helper {
		mode = 0o660
	}
	return agent.ListenStatusSocket(path, mode)
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
	id := n.renewer.Current()
	return agent.NewSessionStatus(id, id.Site, n.Config.GatewayURL, n.bootID, n.session.State()).WithRenewal(n.renewer.Status())
}
