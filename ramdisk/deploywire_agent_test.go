package ramdisk

import (
	"strings"
	"testing"

	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// TestDeployRequestNodeAgent: deploy.image's node_agent reaches the deploy
// (which installs it, TestDeployNodeAgent, and fails on a SHA-256 mismatch,
// TestDeployNodeAgentMismatch); without it the deploy installs none.
func TestDeployRequestNodeAgent(t *testing.T) {
	a := protocol.DeployNodeAgent{Version: "1.2.3", URL: "https://cp.example.test/downloads/bcd/1.2.3/linux-amd64", SHA256: strings.Repeat("ab", 32), Size: 9}
	r := deployRequest(protocol.DeployImageParams{NodeAgent: &a})
	if r.NodeAgent == nil || *r.NodeAgent != (deploy.NodeAgent{Version: a.Version, URL: a.URL, SHA256: a.SHA256, Size: a.Size}) {
		t.Errorf("node agent %+v", r.NodeAgent)
	}
	if r := deployRequest(protocol.DeployImageParams{}); r.NodeAgent != nil {
		t.Errorf("node agent %+v from params without one", r.NodeAgent)
	}
	p := protocol.DeployImageParams{Image: protocol.DeployImage{URL: "https://i.example.test/x", SHA256: strings.Repeat("cd", 32), Size: 1},
		NodeAgent: &protocol.DeployNodeAgent{Version: "1.2.3", URL: a.URL, SHA256: "ABC"}}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "node_agent.sha256") {
		t.Errorf("bad node_agent sha256: %v", err)
	}
}
