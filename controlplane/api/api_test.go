package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/api"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/downloads"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

type notes struct {
	mu           sync.Mutex
	notified     []string
	disconnected []string
	specs        []string
}

func (n *notes) SpecChanged(site string) { n.mu.Lock(); n.specs = append(n.specs, site); n.mu.Unlock() }

func (n *notes) Notify(id string) { n.mu.Lock(); n.notified = append(n.notified, id); n.mu.Unlock() }
func (n *notes) Disconnect(id, _ string) {
	n.mu.Lock()
	n.disconnected = append(n.disconnected, id)
	n.mu.Unlock()
}

type env struct {
	st    store.Store
	url   string
	op    string
	c     *client.Client
	notes *notes
}

func start(t *testing.T, base string) *env {
	t.Helper()
	return startWith(t, base, nil)
}

func startWith(t *testing.T, base string, mut func(*api.Server)) *env {
	t.Helper()
	st := cptest.NewStore(t)
	op := token.NewOperator()
	if _, err := st.EnsureOperatorToken(ctx, op.Hash, time.Now()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bcd_0.1.0_linux_amd64"), []byte("binary"), 0o644)
	dl, err := downloads.New(downloads.Options{Dir: dir, BasePath: base})
	if err != nil {
		t.Fatal(err)
	}
	n := &notes{}
	srv := &api.Server{Store: st, BasePath: base, Downloads: dl, Notifier: n, WellKnown: &protocol.WellKnown{
		Gateway: &protocol.WellKnownGateway{URL: "https://127.0.0.1:8444", ServingCAPin: "sha256/x"},
		Join:    protocol.WellKnownJoin{EncryptionJWK: json.RawMessage(`{"kty":"EC"}`), EncryptionKeyPin: "sha256/e", SigningKeyPin: "sha256/s"},
	}}
	if mut != nil {
		mut(srv)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	c, err := client.New(hs.URL+base, op.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{st, hs.URL, op.Token, c, n}
}

func TestOperatorAuth(t *testing.T) {
	e := start(t, "")
	for name, auth := range map[string]string{
		"missing":        "",
		"not bearer":     "Basic " + e.op,
		"wrong token":    "Bearer " + token.NewOperator().Token,
		"a join token":   "Bearer " + token.NewJoin(time.Now()).Token,
		"garbage":        "Bearer x",
		"token, no type": e.op,
	} {
		req, _ := http.NewRequest("GET", e.url+"/api/v1/nodes", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var er protocol.ErrorResponse
		json.Unmarshal(body, &er)
		if resp.StatusCode != 401 || er.Code != protocol.CodeUnauthenticated {
			t.Errorf("%s: %d %s, want 401 UNAUTHENTICATED", name, resp.StatusCode, body)
		}
		if strings.Contains(string(body), e.op) {
			t.Errorf("%s: the answer quotes the token", name)
		}
	}
	if _, err := e.c.ListNodes(ctx); err != nil {
		t.Errorf("with the operator token: %v", err)
	}
}

func TestTokensAndSites(t *testing.T) {
	e := start(t, "")
	_, err := e.c.CreateToken(ctx, apitype.TokenCreate{Pool: "p1", Site: "nowhere", Role: "node"})
	if client.Code(err) != protocol.CodeNotFound {
		t.Errorf("token for a missing site: %v, want NOT_FOUND", err)
	}
	if _, err := e.c.CreateSite(ctx, "ams1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.CreateSite(ctx, "ams1"); client.Code(err) != protocol.CodeAlreadyExists {
		t.Errorf("site twice: %v", err)
	}
	if _, err := e.c.CreateSite(ctx, "Bad Name"); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("bad site name: %v", err)
	}
	sites, err := e.c.ListSites(ctx)
	if err != nil || len(sites) != 2 {
		t.Fatalf("sites %v %v", sites, err)
	}
	created, err := e.c.CreateToken(ctx, apitype.TokenCreate{Pool: "p1", Site: "ams1", Role: "site", TTLSeconds: 3600, AllowReclaim: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.Token, "bcjt_"+created.ID+"_") || created.State != apitype.TokenActive || !created.AllowReclaim {
		t.Errorf("created %+v", created)
	}
	if d := created.ExpiresAt.Sub(created.CreatedAt); d != time.Hour {
		t.Errorf("ttl %v", d)
	}
	for name, in := range map[string]apitype.TokenCreate{
		"bad role":    {Pool: "p1", Site: "ams1", Role: "ramdisk"},
		"no pool":     {Site: "ams1", Role: "node"},
		"short ttl":   {Pool: "p1", Site: "ams1", Role: "node", TTLSeconds: 5},
		"long ttl":    {Pool: "p1", Site: "ams1", Role: "node", TTLSeconds: 1 << 40},
		"neg ttl":     {Pool: "p1", Site: "ams1", Role: "node", TTLSeconds: -1},
		"bad node id": {Pool: "p1", Site: "ams1", Role: "node", NodeID: "N 1"},
	} {
		if _, err := e.c.CreateToken(ctx, in); client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
	}
	list, err := e.c.ListTokens(ctx)
	if err != nil || len(list) != 1 || list[0].ID != created.ID {
		t.Fatalf("list %+v %v", list, err)
	}
	raw, _ := json.Marshal(list)
	if strings.Contains(string(raw), created.Token[len("bcjt_"+created.ID+"_"):]) || strings.Contains(string(raw), "hash") {
		t.Error("the token list shows the secret or its hash")
	}
	got, err := e.c.RevokeToken(ctx, created.ID)
	if err != nil || got.State != apitype.TokenRevoked {
		t.Errorf("revoke: %+v %v", got, err)
	}
	if _, err := e.c.RevokeToken(ctx, "jt_nope"); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("revoke missing: %v", err)
	}
}

func TestNodesAndCommands(t *testing.T) {
	e := start(t, "/p")
	now := time.Now()
	for _, n := range []store.Node{
		{ID: "n_a", Role: "node", Site: cptest.Site, Pool: "p", SPIFFEID: "spiffe://x/node/n_a", CertSerial: "1", CertNotAfter: now.Add(time.Hour), State: "ready"},
		{ID: "s_b", Role: "site", Site: cptest.Site, Pool: "p", SPIFFEID: "spiffe://x/site/s_b", CertSerial: "2", CertNotAfter: now.Add(time.Hour), State: "adopting"},
	} {
		if err := e.st.Admit(ctx, store.Admission{Node: n, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	nodes, err := e.c.ListNodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	if n, err := e.c.Cordon(ctx, "n_a", true); err != nil || !n.Cordoned {
		t.Errorf("cordon: %+v %v", n, err)
	}
	if n, err := e.c.Cordon(ctx, "n_a", false); err != nil || n.Cordoned {
		t.Errorf("uncordon: %+v %v", n, err)
	}
	if _, err := e.c.Cordon(ctx, "n_missing", true); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("cordon missing: %v", err)
	}
	cmd, err := e.c.CreateCommand(ctx, "n_a", apitype.CommandCreate{Kind: protocol.KindNodeReboot})
	if err != nil {
		t.Fatal(err)
	}
	if cmd.State != store.CommandPending || !strings.HasPrefix(cmd.ID, "cmd_") {
		t.Errorf("command %+v", cmd)
	}
	if got, err := e.c.GetCommand(ctx, cmd.ID); err != nil || got.ID != cmd.ID || got.Kind != protocol.KindNodeReboot {
		t.Errorf("get command %+v %v", got, err)
	}
	if _, err := e.c.GetCommand(ctx, "cmd_nope"); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("missing command: %v", err)
	}
	if _, err := e.c.CreateCommand(ctx, "n_a", apitype.CommandCreate{Kind: protocol.KindBMCPower}); client.Code(err) != protocol.CodeUnsupported {
		t.Errorf("bmc.power to a node: %v, want UNSUPPORTED", err)
	}
	if _, err := e.c.CreateCommand(ctx, "s_b", apitype.CommandCreate{Kind: protocol.KindBMCPower, Params: json.RawMessage(`{"action":"cycle"}`)}); err != nil {
		t.Errorf("bmc.power to a site: %v", err)
	}
	if _, err := e.c.CreateCommand(ctx, "s_b", apitype.CommandCreate{Kind: protocol.KindBMCPower, Params: json.RawMessage(`[1]`)}); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("params not an object: %v", err)
	}
	e.notes.mu.Lock()
	if len(e.notes.notified) != 2 {
		t.Errorf("notified %v, want two", e.notes.notified)
	}
	e.notes.mu.Unlock()

	if n, err := e.c.DeleteNode(ctx, "n_a"); err != nil || n.DeletedAt.IsZero() {
		t.Fatalf("delete: %+v %v", n, err)
	}
	if got, _ := e.c.GetCommand(ctx, cmd.ID); got.State != protocol.StateFailed {
		t.Errorf("a deleted node's open command is %s, want FAILED", got.State)
	}
	if _, err := e.c.DeleteNode(ctx, "n_a"); client.Code(err) != protocol.CodeNodeRevoked {
		t.Errorf("delete twice: %v", err)
	}
	if _, err := e.c.CreateCommand(ctx, "n_a", apitype.CommandCreate{Kind: protocol.KindNodeReboot}); client.Code(err) != protocol.CodeNodeRevoked {
		t.Errorf("command to a deleted node: %v", err)
	}
	e.notes.mu.Lock()
	if len(e.notes.disconnected) != 1 || e.notes.disconnected[0] != "n_a" {
		t.Errorf("disconnected %v", e.notes.disconnected)
	}
	e.notes.mu.Unlock()
	if nodes, _ := e.c.ListNodes(ctx); len(nodes) != 1 {
		t.Errorf("after delete: %d nodes", len(nodes))
	}
}

func TestPublicRoutes(t *testing.T) {
	e := start(t, "/p")
	for _, path := range []string{"/.well-known/better-compute", "/p/.well-known/better-compute"} {
		resp, err := http.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var wk protocol.WellKnown
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &wk) != nil || wk.Gateway == nil {
			t.Errorf("%s: %d %s %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	for path, want := range map[string]int{
		"/p/downloads/bcd/0.1.0/linux-amd64":          200,
		"/p/downloads/bcd/../../api/v1/nodes":         404,
		"/p/downloads/bcd/0.1.0/../0.1.0/linux-amd64": 404,
		"/p/downloads//bcd/0.1.0/linux-amd64":         404,
		"/p/api/v1/nope":                              404,
	} {
		req, _ := http.NewRequest("GET", e.url, nil)
		req.URL.Opaque = path
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
