package bmcplugin

import (
	"context"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/better-compute/bcd/bmc"
)

// Handshake is what bcd and a BMC driver plugin must agree on. The cookie is not a
// secret: it only stops a plugin binary run by hand from serving a terminal.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "BCD_BMC_PLUGIN",
	MagicCookieValue: "bcd-bmc-driver-v1",
}

// Name is the plugin's key in the plugin map.
const Name = "bmc"

// PluginMap is the set of plugins a BMC driver plugin serves and bcd dispenses. impl
// is the driver on the serving side and nil on bcd's side.
func PluginMap(impl bmc.Driver) map[string]plugin.Plugin {
	return map[string]plugin.Plugin{Name: &GRPCPlugin{Impl: impl}}
}

// GRPCPlugin is the go-plugin glue for bmc.Driver.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the driver a plugin serves.
	Impl bmc.Driver
}

// GRPCServer registers the driver service.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&serviceDesc, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns a bmc.Driver that calls the plugin over conn.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return &Client{conn: conn}, nil
}

// Serve runs a plugin serving impl until bcd stops it; a plugin's main calls it
// and nothing else. logger writes JSON lines to stderr, which bcd reads into its
// own log.
func Serve(impl bmc.Driver, logger hclog.Logger) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         PluginMap(impl),
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          logger,
	})
}
