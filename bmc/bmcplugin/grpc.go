package bmcplugin

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/better-compute/bcd/bmc"
)

// serviceName is the gRPC service of a BMC driver plugin.
const serviceName = "bcd.bmc.v1.Driver"

// kindKey is the trailer that carries a failed call's bmc.Kind.
const kindKey = "bcd-bmc-error-kind"

// The messages. A Host travels with every request, password included: the plugin
// keeps no credentials, and this channel (a unix socket under mutual TLS) is the
// only way they reach it.
type (
	wireHost struct {
		Name        string `json:"name"`
		Address     string `json:"address"`
		Port        int    `json:"port,omitempty"`
		Username    string `json:"username"`
		Password    string `json:"password"`
		CipherSuite int    `json:"cipher_suite,omitempty"`
	}
	hostRequest struct {
		Host wireHost `json:"host"`
	}
	bootRequest struct {
		Host       wireHost `json:"host"`
		Device     string   `json:"device"`
		EFI        bool     `json:"efi,omitempty"`
		Persistent bool     `json:"persistent,omitempty"`
	}
	powerReply struct {
		Power bmc.PowerState `json:"power"`
	}
	inventoryReply struct {
		Inventory bmc.Inventory `json:"inventory"`
	}
	emptyReply struct{}
)

func toWire(h bmc.Host) wireHost {
	return wireHost{Name: h.Name, Address: h.Address, Port: h.Port, Username: h.Username,
		Password: string(h.Password), CipherSuite: h.CipherSuite}
}

func (w wireHost) host() bmc.Host {
	return bmc.Host{Name: w.Name, Address: w.Address, Port: w.Port, Username: w.Username,
		Password: bmc.Secret(w.Password), CipherSuite: w.CipherSuite}
}

// driverServer is the handler type the service description names.
type driverServer interface{ driver() bmc.Driver }

type server struct{ impl bmc.Driver }

func (s *server) driver() bmc.Driver { return s.impl }

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*driverServer)(nil),
	Methods: []grpc.MethodDesc{
		unary("PowerStatus", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			p, err := d.PowerStatus(ctx, r.Host.host())
			return &powerReply{Power: p}, err
		}),
		unary("PowerOn", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			return &emptyReply{}, d.PowerOn(ctx, r.Host.host())
		}),
		unary("PowerOff", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			return &emptyReply{}, d.PowerOff(ctx, r.Host.host())
		}),
		unary("PowerCycle", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			return &emptyReply{}, d.PowerCycle(ctx, r.Host.host())
		}),
		unary("PowerReset", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			return &emptyReply{}, d.PowerReset(ctx, r.Host.host())
		}),
		unary("SetBootDevice", func(ctx context.Context, d bmc.Driver, r *bootRequest) (any, error) {
			return &emptyReply{}, d.SetBootDevice(ctx, r.Host.host(), bmc.BootDevice{Device: r.Device, EFI: r.EFI, Persistent: r.Persistent})
		}),
		unary("Inventory", func(ctx context.Context, d bmc.Driver, r *hostRequest) (any, error) {
			inv, err := d.Inventory(ctx, r.Host.host())
			return &inventoryReply{Inventory: inv}, err
		}),
	},
	Metadata: "bmc/bmcplugin",
}

// unary describes one method: decode the request, call the driver, and turn its
// error into a status whose trailer keeps the error's kind.
func unary[Req any](name string, call func(context.Context, bmc.Driver, *Req) (any, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, intercept grpc.UnaryServerInterceptor) (any, error) {
			req := new(Req)
			if err := dec(req); err != nil {
				return nil, err
			}
			handle := func(ctx context.Context, r any) (any, error) {
				ctx, cancel := answerBefore(ctx)
				defer cancel()
				reply, err := call(ctx, srv.(driverServer).driver(), r.(*Req))
				if err != nil {
					return nil, toStatus(ctx, err)
				}
				return reply, nil
			}
			if intercept == nil {
				return handle(ctx, req)
			}
			return intercept(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + serviceName + "/" + name}, handle)
		},
	}
}

// answerBefore gives the driver a deadline a little before the caller's, so that a
// working plugin always answers (if only to say the BMC was too slow): a caller
// whose own deadline passes knows the plugin hung.
func answerBefore(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	margin := min(time.Until(dl)/10, time.Second)
	return context.WithDeadline(ctx, dl.Add(-margin))
}

var kindCodes = map[bmc.Kind]codes.Code{
	bmc.KindInvalid:     codes.InvalidArgument,
	bmc.KindUnsupported: codes.Unimplemented,
	bmc.KindUnreachable: codes.Unavailable,
	bmc.KindAuth:        codes.PermissionDenied,
	bmc.KindBMC:         codes.Aborted,
	bmc.KindPlugin:      codes.Internal,
	bmc.KindInternal:    codes.Internal,
}

func toStatus(ctx context.Context, err error) error {
	kind := bmc.KindOf(err)
	// Best effort: without the trailer the host still fails the call, as a plugin
	// error.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(kindKey, string(kind)))
	return status.Error(kindCodes[kind], err.Error())
}

// Client is bcd's side of a driver plugin: a bmc.Driver whose calls go to the
// plugin. A call that fails without the plugin's word on it (the plugin died, or
// the channel broke) is a bmc.KindPlugin error.
type Client struct{ conn *grpc.ClientConn }

var _ bmc.Driver = (*Client)(nil)

// Conn is the channel to the plugin, for health checks.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

func (c *Client) invoke(ctx context.Context, method string, req, reply any) error {
	var trailer metadata.MD
	err := c.conn.Invoke(ctx, "/"+serviceName+"/"+method, req, reply,
		grpc.CallContentSubtype(codecName), grpc.Trailer(&trailer))
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	if k := trailer.Get(kindKey); len(k) == 1 && k[0] != "" {
		return &bmc.Error{Kind: bmc.Kind(k[0]), Msg: st.Message()}
	}
	return &bmc.Error{Kind: bmc.KindPlugin, Msg: fmt.Sprintf("plugin channel: %s: %s", st.Code(), st.Message()), Err: err}
}

// PowerStatus implements bmc.Driver.
func (c *Client) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	var r powerReply
	if err := c.invoke(ctx, "PowerStatus", &hostRequest{Host: toWire(h)}, &r); err != nil {
		return "", err
	}
	if r.Power != bmc.PowerOn && r.Power != bmc.PowerOff {
		return "", bmc.Errorf(bmc.KindPlugin, "plugin reported power state %q for %s", r.Power, h)
	}
	return r.Power, nil
}

// PowerOn implements bmc.Driver.
func (c *Client) PowerOn(ctx context.Context, h bmc.Host) error {
	return c.invoke(ctx, "PowerOn", &hostRequest{Host: toWire(h)}, &emptyReply{})
}

// PowerOff implements bmc.Driver.
func (c *Client) PowerOff(ctx context.Context, h bmc.Host) error {
	return c.invoke(ctx, "PowerOff", &hostRequest{Host: toWire(h)}, &emptyReply{})
}

// PowerCycle implements bmc.Driver.
func (c *Client) PowerCycle(ctx context.Context, h bmc.Host) error {
	return c.invoke(ctx, "PowerCycle", &hostRequest{Host: toWire(h)}, &emptyReply{})
}

// PowerReset implements bmc.Driver.
func (c *Client) PowerReset(ctx context.Context, h bmc.Host) error {
	return c.invoke(ctx, "PowerReset", &hostRequest{Host: toWire(h)}, &emptyReply{})
}

// SetBootDevice implements bmc.Driver.
func (c *Client) SetBootDevice(ctx context.Context, h bmc.Host, d bmc.BootDevice) error {
	return c.invoke(ctx, "SetBootDevice", &bootRequest{Host: toWire(h), Device: d.Device, EFI: d.EFI, Persistent: d.Persistent}, &emptyReply{})
}

// Inventory implements bmc.Driver.
func (c *Client) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	var r inventoryReply
	if err := c.invoke(ctx, "Inventory", &hostRequest{Host: toWire(h)}, &r); err != nil {
		return bmc.Inventory{}, err
	}
	return r.Inventory, nil
}
