package apitype

import "time"

// TPMEnrollment is an enrolled TPM endorsement key: a tpm join of that EK
// enters Site and Pool (DefaultPool when empty), bound to MachineID when
// it names one.
type TPMEnrollment struct {
	// EKSHA256 is the lower-case hex SHA-256 of the EK's PKIX DER.
	EKSHA256  string    `json:"ek_sha256"`
	Site      string    `json:"site"`
	Pool      string    `json:"pool,omitempty"`
	MachineID string    `json:"machine_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// TPMEnrollmentCreate is the body of POST /api/v1/tpm/enrollments: an
// allow-list entry without a machine.
type TPMEnrollmentCreate struct {
	EKSHA256 string `json:"ek_sha256"`
	Site     string `json:"site"`
	Pool     string `json:"pool"`
}

// TPMEnrollmentList answers GET /api/v1/tpm/enrollments.
type TPMEnrollmentList struct {
	Enrollments []TPMEnrollment `json:"enrollments"`
}

// MachineTPMSet is the body of PUT /api/v1/machines/{m}/tpm: the EK of the
// machine's TPM, and the pool its tpm join enters ("": DefaultPool).
type MachineTPMSet struct {
	EKSHA256 string `json:"ek_sha256"`
	Pool     string `json:"pool,omitempty"`
}

// PoolPolicy is what a pool requires of the joins into it: the attestors
// they may use (empty: any).
type PoolPolicy struct {
	Pool          string   `json:"pool"`
	JoinAttestors []string `json:"join_attestors"`
	// MaxUnavailable is the pool's disruption budget for rollouts; 0 when
	// not set (1 applies).
	MaxUnavailable int       `json:"max_unavailable,omitempty"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// PoolPolicySet is the body of PUT /api/v1/pools/{pool}/policy: the whole
// policy; no attestors and no budget removes it.
type PoolPolicySet struct {
	JoinAttestors  []string `json:"join_attestors"`
	MaxUnavailable int      `json:"max_unavailable,omitempty"`
}

// PoolPolicyList answers GET /api/v1/pools: the pools that have a policy.
type PoolPolicyList struct {
	Pools []PoolPolicy `json:"pools"`
}
