package join

import (
	"context"
	"errors"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// TokenStore is what the token attestors read.
type TokenStore interface {
	GetToken(ctx context.Context, id string) (store.Token, error)
}

// NewTokenAttestor is the join-token attestor: the request's sealed token
// must be a valid, unused, unexpired, unrevoked join token for the request's
// role (and site, when the request names one), not bound to a node id.
func NewTokenAttestor(tokens TokenStore) Attestor {
	return AttestorFunc(func(ctx context.Context, r *Request) (Verdict, error) {
		if r.Join.NodeID != "" {
			return Verdict{}, refuse(protocol.CodeInvalidInput, "node_id is for the %s attestor; the %s attestor gives the node its id", protocol.AttestorProvisioned, protocol.AttestorJoinToken)
		}
		t, err := checkToken(ctx, tokens, r)
		if err != nil {
			return Verdict{}, err
		}
		if t.NodeID != "" {
			return Verdict{}, refuse(protocol.CodeAttestorRefused, "join token %s is bound to node %s: join with --node-id %s (attestor %s)", t.ID, t.NodeID, t.NodeID, protocol.AttestorProvisioned)
		}
		return Verdict{Admit: &Admission{Role: t.Role, Site: t.Site, Pool: t.Pool, AllowReclaim: t.AllowReclaim, TokenID: t.ID}}, nil
	})
}

// NewProvisionedAttestor is the provisioned attestor: an installed OS joins
// with the token its deploy wrote and the node id that token is bound to,
// and gets that node id, reclaiming the node when it exists. A token a
// machine's deploy minted binds the node to that machine.
func NewProvisionedAttestor(tokens TokenStore) Attestor {
	return AttestorFunc(func(ctx context.Context, r *Request) (Verdict, error) {
		if r.Join.NodeID == "" {
			return Verdict{}, refuse(protocol.CodeInvalidInput, "the %s attestor needs node_id", protocol.AttestorProvisioned)
		}
		t, err := checkToken(ctx, tokens, r)
		if err != nil {
			return Verdict{}, err
		}
		switch t.NodeID {
		case "":
			return Verdict{}, refuse(protocol.CodeAttestorRefused, "join token %s is not bound to a node id; join without --node-id", t.ID)
		case r.Join.NodeID:
		default:
			return Verdict{}, refuse(protocol.CodeAttestorRefused, "join token %s is bound to another node id than %s", t.ID, r.Join.NodeID)
		}
		return Verdict{Admit: &Admission{Role: t.Role, Site: t.Site, Pool: t.Pool, NodeID: t.NodeID, AllowReclaim: true, TokenID: t.ID,
			Machine: t.MachineID}}, nil
	})
}

// checkToken finds the request's token and checks it can still be used for
// this request. It changes nothing: the token is consumed only with the node.
func checkToken(ctx context.Context, tokens TokenStore, r *Request) (store.Token, error) {
	if r.Token == "" {
		return store.Token{}, refuse(protocol.CodeInvalidInput, "the %s attestor needs a sealed_token", r.Join.Attestor)
	}
	id, h, err := token.ParseJoin(r.Token)
	if err != nil {
		return store.Token{}, refuse(protocol.CodeTokenUnknown, "the join token is not one this control plane issued")
	}
	t, err := tokens.GetToken(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, refuse(protocol.CodeTokenUnknown, "join token %s is not known", id)
	}
	if err != nil {
		return store.Token{}, err
	}
	if !t.Hash.Equal(h) {
		return store.Token{}, refuse(protocol.CodeTokenUnknown, "join token %s is not known", id)
	}
	switch {
	case !t.RevokedAt.IsZero():
		return t, refuse(protocol.CodeTokenRevoked, "join token %s was revoked", id)
	case !t.UsedAt.IsZero():
		return t, refuse(protocol.CodeTokenUsed, "join token %s was already used", id)
	case !r.Now.Before(t.ExpiresAt):
		return t, refuse(protocol.CodeTokenExpired, "join token %s expired at %s", id, t.ExpiresAt.UTC().Format("2006-01-02T15:04:05Z"))
	case t.Role != r.Join.Role:
		return t, refuse(protocol.CodeWrongRole, "join token %s is for role %s, not %s", id, t.Role, r.Join.Role)
	case r.Join.Site != "" && t.Site != r.Join.Site:
		return t, refuse(protocol.CodeWrongSite, "join token %s is for site %s, not %s", id, t.Site, human.Short(r.Join.Site))
	}
	return t, nil
}
