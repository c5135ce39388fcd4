package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var in apitype.TokenCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := ids.CheckName("pool", in.Pool); err != nil {
		return err
	}
	if err := ids.CheckName("site", in.Site); err != nil {
		return err
	}
	if in.Role != protocol.RoleNode && in.Role != protocol.RoleSite {
		return httpjson.Errorf(protocol.CodeInvalidInput, "role %q: want node or site", human.ShortN(in.Role, 80))
	}
	if in.NodeID != "" && !protocol.ValidNodeID(in.NodeID) {
		return httpjson.Errorf(protocol.CodeInvalidInput, "node_id %q: want 1 to 64 characters of a-z, 0-9, _ and -", human.ShortN(in.NodeID, 80))
	}
	ttl := DefaultTokenTTL
	if in.TTLSeconds != 0 {
		ttl = time.Duration(in.TTLSeconds) * time.Second
	}
	if ttl < MinTokenTTL || ttl > MaxTokenTTL || in.TTLSeconds < 0 || in.TTLSeconds > int64(MaxTokenTTL/time.Second) {
		return httpjson.Errorf(protocol.CodeInvalidInput, "ttl_s %d: want %d to %d seconds", in.TTLSeconds, int64(MinTokenTTL/time.Second), int64(MaxTokenTTL/time.Second))
	}
	now := s.now()
	j := token.NewJoin(now)
	t := store.Token{
		ID: j.ID, Hash: j.Hash, Pool: in.Pool, Site: in.Site, Role: in.Role, NodeID: in.NodeID,
		AllowReclaim: in.AllowReclaim, CreatedAt: now, ExpiresAt: now.Add(ttl),
	}
	if err := s.Store.CreateToken(r.Context(), t); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return httpjson.Errorf(protocol.CodeNotFound, "site %s does not exist (better-compute sites create %s)", in.Site, in.Site)
		}
		return err
	}
	s.log().Info("join token created", "token", t.ID, "pool", t.Pool, "site", t.Site, "role", t.Role, "node_id", t.NodeID,
		"allow_reclaim", t.AllowReclaim, "expires", t.ExpiresAt)
	httpjson.WriteJSON(w, http.StatusCreated, apitype.TokenCreated{TokenInfo: toToken(t, now), Token: j.Token})
	return nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	toks, err := s.Store.ListTokens(r.Context())
	if err != nil {
		return err
	}
	now := s.now()
	out := apitype.TokenList{Tokens: make([]apitype.TokenInfo, 0, len(toks))}
	for _, t := range toks {
		out.Tokens = append(out.Tokens, toToken(t, now))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.Store.RevokeToken(r.Context(), id, s.now()); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return httpjson.Errorf(protocol.CodeNotFound, "join token %s does not exist", human.ShortN(id, 80))
		}
		return err
	}
	t, err := s.Store.GetToken(r.Context(), id)
	if err != nil {
		return err
	}
	s.log().Info("join token revoked", "token", id)
	httpjson.WriteJSON(w, http.StatusOK, toToken(t, s.now()))
	return nil
}

func (s *Server) createSite(w http.ResponseWriter, r *http.Request) error {
	var in apitype.SiteCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := ids.CheckName("site", in.Name); err != nil {
		return err
	}
	switch in.Approval {
	case "":
		in.Approval = store.ApprovalAuto
	case store.ApprovalAuto, store.ApprovalManual:
	default:
		return httpjson.Errorf(protocol.CodeInvalidInput, "approval %q: want auto or manual", human.ShortN(in.Approval, 80))
	}
	site := store.Site{Name: in.Name, Approval: in.Approval, SpecRevision: 1, CreatedAt: s.now()}
	if err := s.Store.CreateSite(r.Context(), site); err != nil {
		if errors.Is(err, store.ErrExists) {
			return httpjson.Errorf(protocol.CodeAlreadyExists, "site %s already exists", in.Name)
		}
		return err
	}
	s.log().Info("site created", "site", site.Name, "approval", site.Approval)
	httpjson.WriteJSON(w, http.StatusCreated, toSite(site))
	return nil
}

func (s *Server) listSites(w http.ResponseWriter, r *http.Request) error {
	sites, err := s.Store.ListSites(r.Context())
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, apitype.SiteList{Sites: toSites(sites)})
	return nil
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	nodes, err := s.Store.ListNodes(r.Context())
	if err != nil {
		return err
	}
	secs, err := s.Store.ListSectionStatuses(r.Context(), protocol.SectionDaemon)
	if err != nil {
		return err
	}
	daemon := make(map[string]*store.SectionStatus, len(secs))
	for i := range secs {
		daemon[secs[i].NodeID] = &secs[i]
	}
	out := apitype.NodeList{Nodes: make([]apitype.NodeInfo, 0, len(nodes))}
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, toNode(n, daemon[n.ID]))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

// node reads the node of the route, as a refusal when there is none.
func (s *Server) node(r *http.Request) (store.Node, error) {
	id := r.PathValue("id")
	n, err := s.Store.GetNode(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return n, httpjson.Errorf(protocol.CodeNotFound, "node %s does not exist", human.ShortN(id, 80))
	}
	return n, err
}

// nodeErr turns a store error about the route's node into a refusal.
func nodeErr(id string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return httpjson.Errorf(protocol.CodeNotFound, "node %s does not exist", human.ShortN(id, 80))
	case errors.Is(err, store.ErrNodeDeleted):
		return httpjson.Errorf(protocol.CodeNodeRevoked, "node %s was deleted", human.ShortN(id, 80))
	}
	return err
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) error {
	n, err := s.node(r)
	if err != nil {
		return err
	}
	var daemon *store.SectionStatus
	switch sec, err := s.Store.GetSectionStatus(r.Context(), n.ID, protocol.SectionDaemon); {
	case err == nil:
		daemon = &sec
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toNode(n, daemon))
	return nil
}

func (s *Server) deleteNode(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.Store.DeleteNode(r.Context(), id, s.now()); err != nil {
		return nodeErr(id, err)
	}
	if s.Notifier != nil {
		s.Notifier.Disconnect(id, "the node was deleted")
	}
	s.log().Info("node deleted", "node", id)
	return s.getNode(w, r)
}

func (s *Server) cordon(on bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id := r.PathValue("id")
		if err := s.Store.SetCordoned(r.Context(), id, on, s.now()); err != nil {
			return nodeErr(id, err)
		}
		s.log().Info("node cordon changed", "node", id, "cordoned", on)
		return s.getNode(w, r)
	}
}

func (s *Server) createCommand(w http.ResponseWriter, r *http.Request) error {
	var in apitype.CommandCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	n, err := s.node(r)
	if err != nil {
		return err
	}
	if n.Deleted() {
		return nodeErr(n.ID, store.ErrNodeDeleted)
	}
	if !protocol.KindAllowed(n.Role, in.Kind) {
		return httpjson.Errorf(protocol.CodeUnsupported, "a %s does not run %q commands", n.Role, human.ShortN(in.Kind, 80))
	}
	params := bytes.TrimSpace(in.Params)
	if len(params) > 0 && !bytes.Equal(params, []byte("null")) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(params, &obj); err != nil {
			return httpjson.Errorf(protocol.CodeInvalidInput, "params: want a JSON object")
		}
	} else {
		params = nil
	}
	now := s.now()
	c := store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: n.ID, Kind: in.Kind, Params: params,
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	if err := s.Store.CreateCommand(r.Context(), c); err != nil {
		return err
	}
	if s.Notifier != nil {
		s.Notifier.Notify(n.ID)
	}
	s.log().Info("command enqueued", "command", c.ID, "node", n.ID, "kind", c.Kind)
	httpjson.WriteJSON(w, http.StatusCreated, toCommand(c))
	return nil
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	c, err := s.Store.GetCommand(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return httpjson.Errorf(protocol.CodeNotFound, "command %s does not exist", human.ShortN(id, 80))
	}
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toCommand(c))
	return nil
}
