package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/protocol"
)

// maxResponse bounds what the client reads of an answer.
const maxResponse = 16 << 20

// Client talks to one control plane apitype.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// New returns a client for the api at server (https://host[:port][/basePath])
// that authenticates with the operator token and trusts roots (nil: the
// system roots).
func New(server, operatorToken string, roots *x509.CertPool) (*Client, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("server %q: want https://host[:port][/base-path]", server)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	tr.Proxy = nil
	return &Client{
		base:  strings.TrimSuffix(u.String(), "/"),
		token: operatorToken,
		http: &http.Client{Transport: tr, Timeout: 60 * time.Second,
			// The bearer token must not follow a redirect to another host.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	}, nil
}

// Do sends a JSON request to path (below the server URL) and decodes a 2xx
// answer into out. Any other answer is returned as *protocol.ErrorResponse.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, c.base+path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, c.base+path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e protocol.ErrorResponse
		if json.Unmarshal(data, &e) == nil && e.Code != "" {
			return &e
		}
		return fmt.Errorf("%s %s: HTTP %d (not a better-compute api?)", method, c.base+path, resp.StatusCode)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, c.base+path, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// CreateToken creates a join token.
func (c *Client) CreateToken(ctx context.Context, in apitype.TokenCreate) (apitype.TokenCreated, error) {
	var out apitype.TokenCreated
	return out, c.Do(ctx, http.MethodPost, "/api/v1/tokens", in, &out)
}

// ListTokens lists the join tokens.
func (c *Client) ListTokens(ctx context.Context) ([]apitype.TokenInfo, error) {
	var out apitype.TokenList
	return out.Tokens, c.Do(ctx, http.MethodGet, "/api/v1/tokens", nil, &out)
}

// RevokeToken revokes a join token.
func (c *Client) RevokeToken(ctx context.Context, id string) (apitype.TokenInfo, error) {
	var out apitype.TokenInfo
	return out, c.Do(ctx, http.MethodPost, "/api/v1/tokens/"+esc(id)+"/revoke", nil, &out)
}

// CreateSite creates a site.
func (c *Client) CreateSite(ctx context.Context, name string) (apitype.Site, error) {
	var out apitype.Site
	return out, c.Do(ctx, http.MethodPost, "/api/v1/sites", apitype.SiteCreate{Name: name}, &out)
}

// CreateSiteWith creates a site with a policy.
func (c *Client) CreateSiteWith(ctx context.Context, in apitype.SiteCreate) (apitype.Site, error) {
	var out apitype.Site
	return out, c.Do(ctx, http.MethodPost, "/api/v1/sites", in, &out)
}

// SetSiteHTTPProxy sets a site's proxy for the boot network; nil removes it.
func (c *Client) SetSiteHTTPProxy(ctx context.Context, site string, p *protocol.HTTPProxySection) (apitype.Site, error) {
	var out apitype.Site
	if p == nil {
		return out, c.Do(ctx, http.MethodDelete, "/api/v1/sites/"+esc(site)+"/http-proxy", nil, &out)
	}
	return out, c.Do(ctx, http.MethodPut, "/api/v1/sites/"+esc(site)+"/http-proxy", p, &out)
}

// ListSites lists the sites.
func (c *Client) ListSites(ctx context.Context) ([]apitype.Site, error) {
	var out apitype.SiteList
	return out.Sites, c.Do(ctx, http.MethodGet, "/api/v1/sites", nil, &out)
}

// ListNodes lists the nodes that are not deleted.
func (c *Client) ListNodes(ctx context.Context) ([]apitype.NodeInfo, error) {
	var out apitype.NodeList
	return out.Nodes, c.Do(ctx, http.MethodGet, "/api/v1/nodes", nil, &out)
}

// GetNode reads a node.
func (c *Client) GetNode(ctx context.Context, id string) (apitype.NodeInfo, error) {
	var out apitype.NodeInfo
	return out, c.Do(ctx, http.MethodGet, "/api/v1/nodes/"+esc(id), nil, &out)
}

// DeleteNode deletes a node, revoking its identity.
func (c *Client) DeleteNode(ctx context.Context, id string) (apitype.NodeInfo, error) {
	var out apitype.NodeInfo
	return out, c.Do(ctx, http.MethodDelete, "/api/v1/nodes/"+esc(id), nil, &out)
}

// Cordon cordons (on) or uncordons a node.
func (c *Client) Cordon(ctx context.Context, id string, on bool) (apitype.NodeInfo, error) {
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	var out apitype.NodeInfo
	return out, c.Do(ctx, http.MethodPost, "/api/v1/nodes/"+esc(id)+"/"+verb, nil, &out)
}

// CreateCommand enqueues a command for a node.
func (c *Client) CreateCommand(ctx context.Context, nodeID string, in apitype.CommandCreate) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodPost, "/api/v1/nodes/"+esc(nodeID)+"/commands", in, &out)
}

// GetCommand reads a command.
func (c *Client) GetCommand(ctx context.Context, id string) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodGet, "/api/v1/commands/"+esc(id), nil, &out)
}

// WaitCommand polls a command every interval until it is in a terminal
// state or ctx is done, and returns it as last read.
func (c *Client) WaitCommand(ctx context.Context, id string, interval time.Duration) (apitype.Command, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cmd, err := c.GetCommand(ctx, id)
		if err != nil || protocol.Terminal(cmd.State) {
			return cmd, err
		}
		select {
		case <-ctx.Done():
			return cmd, fmt.Errorf("command %s is still %s: %w", id, cmd.State, ctx.Err())
		case <-t.C:
		}
	}
}

func machinePath(ref string) string { return "/api/v1/machines/" + esc(ref) }

// CreateMachine adds a machine.
func (c *Client) CreateMachine(ctx context.Context, in apitype.MachineCreate) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPost, "/api/v1/machines", in, &out)
}

// ListMachines lists the machines of site ("" for every site).
func (c *Client) ListMachines(ctx context.Context, site string) ([]apitype.MachineInfo, error) {
	var out apitype.MachineList
	path := "/api/v1/machines"
	if site != "" {
		path += "?site=" + url.QueryEscape(site)
	}
	return out.Machines, c.Do(ctx, http.MethodGet, path, nil, &out)
}

// GetMachine reads a machine by id, name or MAC.
func (c *Client) GetMachine(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodGet, machinePath(ref), nil, &out)
}

// DeleteMachine removes a machine.
func (c *Client) DeleteMachine(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodDelete, machinePath(ref), nil, &out)
}

// SetBootMode sets a machine's boot mode: ramdisk, local or none.
func (c *Client) SetBootMode(ctx context.Context, ref, mode string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPut, machinePath(ref)+"/boot", apitype.MachineBoot{Mode: mode}, &out)
}

// SetBMC sets a machine's BMC; a nil password keeps the one it has.
func (c *Client) SetBMC(ctx context.Context, ref string, in apitype.MachineBMCInput) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPut, machinePath(ref)+"/bmc", in, &out)
}

// ClearBMC removes a machine's BMC.
func (c *Client) ClearBMC(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodDelete, machinePath(ref)+"/bmc", nil, &out)
}

// ApproveMachine lets a machine's ramdisk join in a site with manual
// approval.
func (c *Client) ApproveMachine(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/approve", nil, &out)
}

// MachineEvents reads a machine's timeline, the latest limit events (0:
// the api's default).
func (c *Client) MachineEvents(ctx context.Context, ref string, limit int) (apitype.MachineEventList, error) {
	var out apitype.MachineEventList
	path := machinePath(ref) + "/events"
	if limit > 0 {
		path += fmt.Sprintf("?limit=%d", limit)
	}
	return out, c.Do(ctx, http.MethodGet, path, nil, &out)
}

// Power enqueues bmc.power for a machine at a site agent of its site.
func (c *Client) Power(ctx context.Context, ref, action string) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/power", apitype.MachinePower{Action: action}, &out)
}

// Bootdev enqueues bmc.bootdev for a machine at a site agent of its site.
func (c *Client) Bootdev(ctx context.Context, ref string, in apitype.MachineBootdev) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/bootdev", in, &out)
}

// Inventory enqueues inventory at the machine's ramdisk node.
func (c *Client) Inventory(ctx context.Context, ref string) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/inventory", nil, &out)
}

// Deploy starts a deployment of the machine, which the control plane's
// lifecycle runs to provisioned or failed.
func (c *Client) Deploy(ctx context.Context, ref string, in apitype.DeployCreate) (apitype.DeployCreated, error) {
	var out apitype.DeployCreated
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/deploy", in, &out)
}

// CancelDeploy stops the machine's running deployment; the machine is
// failed, "cancelled by operator".
func (c *Client) CancelDeploy(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPost, machinePath(ref)+"/cancel", nil, &out)
}

// SetFirmware sets a machine's firmware: bios or uefi.
func (c *Client) SetFirmware(ctx context.Context, ref, firmware string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPut, machinePath(ref)+"/firmware", apitype.MachineFirmware{Firmware: firmware}, &out)
}

// Code is the refusal code of err, "" when err is not a refusal.
func Code(err error) string {
	var e *protocol.ErrorResponse
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// AddImage adds an entry to the image catalog.
func (c *Client) AddImage(ctx context.Context, in apitype.ImageCreate) (apitype.Image, error) {
	var out apitype.Image
	return out, c.Do(ctx, http.MethodPost, "/api/v1/images", in, &out)
}

// ListImages lists the image catalog, by name.
func (c *Client) ListImages(ctx context.Context) ([]apitype.Image, error) {
	var out apitype.ImageList
	return out.Images, c.Do(ctx, http.MethodGet, "/api/v1/images", nil, &out)
}

// GetImage reads a catalog entry.
func (c *Client) GetImage(ctx context.Context, name string) (apitype.Image, error) {
	var out apitype.Image
	return out, c.Do(ctx, http.MethodGet, "/api/v1/images/"+esc(name), nil, &out)
}

// DeleteImage removes a catalog entry and returns it; deployments that
// used it keep their copy of its fields.
func (c *Client) DeleteImage(ctx context.Context, name string) (apitype.Image, error) {
	var out apitype.Image
	return out, c.Do(ctx, http.MethodDelete, "/api/v1/images/"+esc(name), nil, &out)
}
