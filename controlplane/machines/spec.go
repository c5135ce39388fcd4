package machines

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// SpecStore is what Specs reads.
type SpecStore interface {
	GetSite(ctx context.Context, name string) (store.Site, error)
	ListMachines(ctx context.Context, site string) ([]store.Machine, error)
}

// Specs builds agents' desired state from the store.
type Specs struct {
	// Store holds sites and machines.
	Store SpecStore
	// GatewayURL is the gateway URL agents are given; a site's proxy always
	// allows its host:port.
	GatewayURL string
}

// Spec is node's desired state now. A node or site agent with a daemon
// target gets it as the daemon section. A site agent's revision is its
// site's plus its own: both only grow, so the sum grows with either (a
// machine of the site, the agent's own daemon target).
func (s *Specs) Spec(ctx context.Context, node store.Node) (*protocol.Spec, error) {
	if node.Role != protocol.RoleSite {
		spec := &protocol.Spec{Revision: node.SpecRevision}
		if node.Role == protocol.RoleNode && node.DaemonTarget != nil {
			b, err := json.Marshal(node.DaemonTarget)
			if err != nil {
				return nil, fmt.Errorf("spec of %s: %s: %w", node.ID, protocol.SectionDaemon, err)
			}
			spec.Sections = map[string]json.RawMessage{protocol.SectionDaemon: b}
		}
		return spec, nil
	}
	// The site first: a machine changed after this read is in the list
	// below with an older revision, and pushed again under the newer one;
	// the other order could send a newer revision with older machines.
	site, err := s.Store.GetSite(ctx, node.Site)
	if err != nil {
		return nil, fmt.Errorf("spec of %s: %w", node.ID, err)
	}
	ms, err := s.Store.ListMachines(ctx, site.Name)
	if err != nil {
		return nil, fmt.Errorf("spec of %s: %w", node.ID, err)
	}
	boot := protocol.BootSection{Entries: []protocol.BootEntry{}}
	bmcs := protocol.BMCHostsSection{Hosts: []protocol.BMCHost{}}
	for _, m := range ms {
		if mode := m.EffectiveBootMode(); mode != "" {
			for _, mac := range m.MACs {
				boot.Entries = append(boot.Entries, protocol.BootEntry{MAC: mac, Mode: mode})
			}
		}
		if m.BMC != nil {
			bmcs.Hosts = append(bmcs.Hosts, protocol.BMCHost{Machine: m.ID, Address: m.BMC.Address, Port: m.BMC.Port,
				Username: m.BMC.Username, Password: m.BMC.Password, CipherSuite: m.BMC.CipherSuite})
		}
	}
	sections := map[string]any{protocol.SectionBoot: boot, protocol.SectionBMCHosts: bmcs}
	if site.HTTPProxy != nil {
		p := *site.HTTPProxy
		p.Allow = slices.Clone(p.Allow)
		if gw, err := GatewayHostPort(s.GatewayURL); err == nil && !slices.Contains(p.Allow, gw) {
			p.Allow = append(p.Allow, gw)
		}
		sections[protocol.SectionHTTPProxy] = p
	}
	if node.DaemonTarget != nil {
		sections[protocol.SectionDaemon] = node.DaemonTarget
	}
	spec := &protocol.Spec{Revision: site.SpecRevision + node.SpecRevision, Sections: make(map[string]json.RawMessage, len(sections))}
	for name, v := range sections {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("spec of %s: %s: %w", node.ID, name, err)
		}
		spec.Sections[name] = b
	}
	return spec, nil
}

// GatewayHostPort is the host:port a gateway URL connects to (port 443
// when it names none).
func GatewayHostPort(gatewayURL string) (string, error) {
	u, err := url.Parse(gatewayURL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("gateway url %q has no host", gatewayURL)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
