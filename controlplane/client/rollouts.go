package client

import (
	"context"
	"net/http"

	"github.com/better-compute/bcd/controlplane/apitype"
)

// AddRelease adds a signed release; Added in the answer says whether it was
// new.
func (c *Client) AddRelease(ctx context.Context, in apitype.ReleaseAdd) (apitype.Release, error) {
	var out apitype.Release
	return out, c.Do(ctx, http.MethodPost, "/api/v1/releases", in, &out)
}

// ListReleases lists the releases added, highest sequence first.
func (c *Client) ListReleases(ctx context.Context) ([]apitype.Release, error) {
	var out apitype.ReleaseList
	return out.Releases, c.Do(ctx, http.MethodGet, "/api/v1/releases", nil, &out)
}

// CreateRollout starts a rollout.
func (c *Client) CreateRollout(ctx context.Context, in apitype.RolloutCreate) (apitype.Rollout, error) {
	var out apitype.Rollout
	return out, c.Do(ctx, http.MethodPost, "/api/v1/rollouts", in, &out)
}

// ListRollouts lists the rollouts, newest first, without nodes or timeline.
func (c *Client) ListRollouts(ctx context.Context) ([]apitype.Rollout, error) {
	var out apitype.RolloutList
	return out.Rollouts, c.Do(ctx, http.MethodGet, "/api/v1/rollouts", nil, &out)
}

// GetRollout reads a rollout with its nodes and timeline.
func (c *Client) GetRollout(ctx context.Context, id string) (apitype.Rollout, error) {
	var out apitype.Rollout
	return out, c.Do(ctx, http.MethodGet, "/api/v1/rollouts/"+esc(id), nil, &out)
}

// ActOnRollout pauses, resumes or aborts a rollout (action pause, resume or
// abort).
func (c *Client) ActOnRollout(ctx context.Context, id, action string) (apitype.Rollout, error) {
	var out apitype.Rollout
	return out, c.Do(ctx, http.MethodPost, "/api/v1/rollouts/"+esc(id)+"/"+esc(action), nil, &out)
}

// UpgradeNode sends a node a daemon.upgrade; the answer is the command.
func (c *Client) UpgradeNode(ctx context.Context, nodeID string, in apitype.NodeUpgrade) (apitype.Command, error) {
	var out apitype.Command
	return out, c.Do(ctx, http.MethodPost, "/api/v1/nodes/"+esc(nodeID)+"/upgrade", in, &out)
}

// Server is the api URL the client talks to, with its base path.
func (c *Client) Server() string { return c.base }
