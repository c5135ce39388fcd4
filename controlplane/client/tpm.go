package client

import (
	"context"
	"net/http"

	"github.com/better-compute/bcd/controlplane/apitype"
)

// EnrollMachineTPM enrolls the endorsement key of a machine's TPM.
func (c *Client) EnrollMachineTPM(ctx context.Context, ref string, in apitype.MachineTPMSet) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodPut, machinePath(ref)+"/tpm", in, &out)
}

// ClearMachineTPM removes a machine's TPM enrollment.
func (c *Client) ClearMachineTPM(ctx context.Context, ref string) (apitype.MachineInfo, error) {
	var out apitype.MachineInfo
	return out, c.Do(ctx, http.MethodDelete, machinePath(ref)+"/tpm", nil, &out)
}

// EnrollTPM adds an allow-list entry: an endorsement key that joins a site
// and pool without a machine.
func (c *Client) EnrollTPM(ctx context.Context, in apitype.TPMEnrollmentCreate) (apitype.TPMEnrollment, error) {
	var out apitype.TPMEnrollment
	return out, c.Do(ctx, http.MethodPost, "/api/v1/tpm/enrollments", in, &out)
}

// ListTPMEnrollments lists every enrolled endorsement key.
func (c *Client) ListTPMEnrollments(ctx context.Context) ([]apitype.TPMEnrollment, error) {
	var out apitype.TPMEnrollmentList
	return out.Enrollments, c.Do(ctx, http.MethodGet, "/api/v1/tpm/enrollments", nil, &out)
}

// RevokeTPMEnrollment removes the enrollment of an endorsement key (its
// SHA-256), a machine's or an allow-list entry.
func (c *Client) RevokeTPMEnrollment(ctx context.Context, ekSHA256 string) (apitype.TPMEnrollment, error) {
	var out apitype.TPMEnrollment
	return out, c.Do(ctx, http.MethodDelete, "/api/v1/tpm/enrollments/"+esc(ekSHA256), nil, &out)
}

// SetPoolPolicy sets the attestors a join into pool may use (none: any).
func (c *Client) SetPoolPolicy(ctx context.Context, pool string, in apitype.PoolPolicySet) (apitype.PoolPolicy, error) {
	var out apitype.PoolPolicy
	return out, c.Do(ctx, http.MethodPut, "/api/v1/pools/"+esc(pool)+"/policy", in, &out)
}

// GetPoolPolicy reads a pool's policy.
func (c *Client) GetPoolPolicy(ctx context.Context, pool string) (apitype.PoolPolicy, error) {
	var out apitype.PoolPolicy
	return out, c.Do(ctx, http.MethodGet, "/api/v1/pools/"+esc(pool)+"/policy", nil, &out)
}

// ListPoolPolicies lists the pools that have a policy.
func (c *Client) ListPoolPolicies(ctx context.Context) ([]apitype.PoolPolicy, error) {
	var out apitype.PoolPolicyList
	return out.Pools, c.Do(ctx, http.MethodGet, "/api/v1/pools", nil, &out)
}
