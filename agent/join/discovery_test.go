package join

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/protocol"
)

const testNonce = "Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_"

func discoveryClient(g *agenttest.Gateway) *Client {
	return &Client{
		GatewayURL: g.URL,
		ServerName: "127.0.0.1",
		Pins:       g.Pins,
		// No EncryptionKey: a discovery join seals nothing.
		Backoff:     agent.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		MaxDeferral: 10 * time.Millisecond,
		GiveUpAfter: 5 * time.Second,
	}
}

func discoveryRequest() Request {
	return Request{
		Role:      protocol.RoleRamdisk,
		Attestor:  protocol.AttestorDiscovery,
		BootNonce: testNonce,
		Claims:    protocol.Claims{MACs: []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}},
	}
}

func TestDiscoveryJoin(t *testing.T) {
	g := agenttest.New(t)
	g.Nonces[testNonce] = agenttest.Nonce{MAC: "52:54:00:00:00:02", Site: "fsn1"}
	g.Defer = 2
	c := discoveryClient(g)
	var deferrals []int
	c.OnDeferral = func(wait time.Duration, n int) { deferrals = append(deferrals, n) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, key, err := c.Join(ctx, discoveryRequest())
	if err != nil {
		t.Fatal(err)
	}
	if id.Role != protocol.RoleRamdisk || id.Site != "fsn1" || !strings.HasPrefix(id.NodeID, "ramdisk_") || key == nil {
		t.Fatalf("identity %+v", id)
	}
	joins := g.Joins()
	if len(joins) != 3 {
		t.Fatalf("%d join requests, want 2 deferred and 1 answered", len(joins))
	}
	for i, j := range joins {
		if j.CSR != joins[0].CSR {
			t.Errorf("request %d has another CSR", i)
		}
		if j.Attestor != protocol.AttestorDiscovery || j.BootNonce != testNonce || j.SealedToken != "" || len(j.Claims.MACs) != 2 {
			t.Errorf("request %d: %+v", i, j)
		}
	}
	if len(deferrals) != 2 || deferrals[1] != 2 {
		t.Errorf("OnDeferral calls: %v", deferrals)
	}
	// The nonce is spent: a second join with it is refused, not retried.
	_, _, err = c.Join(ctx, discoveryRequest())
	var refused *RefusedError
	if !asRefused(err, &refused) || refused.Response.Code != protocol.CodeAttestorRefused {
		t.Fatalf("second join: %v", err)
	}
}

func asRefused(err error, target **RefusedError) bool {
	r, ok := err.(*RefusedError)
	if ok {
		*target = r
	}
	return ok
}

func TestDiscoveryRequestChecks(t *testing.T) {
	g := agenttest.New(t)
	c := discoveryClient(g)
	for _, tc := range []struct {
		edit func(*Request)
		want string
	}{
		{func(r *Request) { r.Role = protocol.RoleNode }, "joins role ramdisk"},
		{func(r *Request) { r.BootNonce = "" }, "needs the boot nonce"},
		{func(r *Request) { r.Token = "bcjt_x" }, "takes no token"},
		{func(r *Request) { r.Claims.MACs = nil }, "needs the machine's MACs"},
		{func(r *Request) { r.Attestor = protocol.AttestorJoinToken; r.Token = "bcjt_x" }, "role ramdisk joins with the discovery attestor"},
	} {
		r := discoveryRequest()
		tc.edit(&r)
		_, _, err := c.Join(context.Background(), r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", r, err, tc.want)
		}
	}
	if n := len(g.Joins()); n != 0 {
		t.Fatalf("%d requests reached the gateway", n)
	}
}
