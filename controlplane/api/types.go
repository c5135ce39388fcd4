package api

import (
	"encoding/json"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

// TokenCreate is the body of POST /api/v1/tokens.
type TokenCreate struct {
	Pool string `json:"pool"`
	Site string `json:"site"`
	Role string `json:"role"`
	// TTLSeconds is the token's lifetime; 0 means DefaultTokenTTL.
	TTLSeconds   int64  `json:"ttl_s,omitempty"`
	AllowReclaim bool   `json:"allow_reclaim,omitempty"`
	NodeID       string `json:"node_id,omitempty"`
}

// TokenInfo is a join token's record and its state: active, used, revoked
// or expired.
type TokenInfo struct {
	store.Token
	State string `json:"state"`
}

// TokenCreated answers TokenCreate. Token is the secret, shown once.
type TokenCreated struct {
	TokenInfo
	Token string `json:"token"`
}

// TokenList answers GET /api/v1/tokens.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// SiteCreate is the body of POST /api/v1/sites.
type SiteCreate struct {
	Name string `json:"name"`
}

// SiteList answers GET /api/v1/sites.
type SiteList struct {
	Sites []store.Site `json:"sites"`
}

// NodeInfo is a node and whether it has a session.
type NodeInfo struct {
	store.Node
	Connected bool `json:"connected"`
}

// NodeList answers GET /api/v1/nodes.
type NodeList struct {
	Nodes []NodeInfo `json:"nodes"`
}

// CommandCreate is the body of POST /api/v1/nodes/{id}/commands.
type CommandCreate struct {
	Kind   string          `json:"kind"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Token states.
const (
	TokenActive  = "active"
	TokenUsed    = "used"
	TokenRevoked = "revoked"
	TokenExpired = "expired"
)

// TokenState says whether t can still be used at now, and if not why.
func TokenState(t store.Token, now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return TokenRevoked
	case !t.UsedAt.IsZero():
		return TokenUsed
	case !now.Before(t.ExpiresAt):
		return TokenExpired
	}
	return TokenActive
}
