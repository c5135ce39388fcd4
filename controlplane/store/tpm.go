package store

import (
	"context"
	"errors"
	"time"
)

// ErrEKEnrolled: the TPM endorsement key is enrolled for another machine
// (or as an allow-list entry without one). The error that wraps it names the
// holder (*EKConflictError).
var ErrEKEnrolled = errors.New("TPM endorsement key already enrolled")

// TPMEnrollment lets a TPM join: the endorsement key whose SHA-256 (of its
// PKIX DER, lower-case hex) it is joins role node in Site and Pool, bound to
// MachineID when one is named. A machine has at most one: the EK of its TPM.
type TPMEnrollment struct {
	EKSHA256 string `json:"ek_sha256"`
	Site     string `json:"site"`
	// Pool is the pool the node joins; "" means the default pool.
	Pool string `json:"pool,omitempty"`
	// MachineID is the machine whose TPM it is, "" for an allow-list entry.
	MachineID string    `json:"machine_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// EKConflictError says who holds an endorsement key that was given for
// another machine. It wraps ErrEKEnrolled.
type EKConflictError struct {
	EKSHA256 string
	// Machine holds it; "" for an allow-list entry.
	Machine string
}

func (e *EKConflictError) Error() string {
	if e.Machine == "" {
		return "the TPM endorsement key " + e.EKSHA256 + " is enrolled without a machine (better-compute tpm revoke " + e.EKSHA256 + " first)"
	}
	return "the TPM endorsement key " + e.EKSHA256 + " belongs to machine " + e.Machine
}

func (e *EKConflictError) Unwrap() error { return ErrEKEnrolled }

// PoolPolicy is what a pool requires of the joins into it.
type PoolPolicy struct {
	Pool string `json:"pool"`
	// JoinAttestors are the attestors (protocol.Attestor*) a join into the
	// pool may use; empty allows every attestor.
	JoinAttestors []string `json:"join_attestors"`
	// MaxUnavailable is the pool's disruption budget: how many of its nodes
	// a rollout may have updating or offline at once. 0: not set (a rollout
	// without --max-unavailable then takes 1).
	MaxUnavailable int       `json:"max_unavailable,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// Allows reports whether a join with attestor may enter the pool.
func (p PoolPolicy) Allows(attestor string) bool {
	if len(p.JoinAttestors) == 0 {
		return true
	}
	for _, a := range p.JoinAttestors {
		if a == attestor {
			return true
		}
	}
	return false
}

// TPMEnrollments holds enrolled TPM endorsement keys. A machine's enrollment
// is part of its spec: it is written with UpdateMachine (SetTPM), or by the
// join that the operator approved (Admission.TPMEnrollment); the methods
// here write allow-list entries, which name no machine.
type TPMEnrollments interface {
	// EnrollTPM stores an allow-list entry (e.MachineID must be ""):
	// ErrNotFound for a missing site, *EKConflictError when a machine holds
	// the EK; an entry of the same EK is replaced.
	EnrollTPM(ctx context.Context, e TPMEnrollment) error
	// GetTPMEnrollment returns the enrollment of an EK, or ErrNotFound.
	GetTPMEnrollment(ctx context.Context, ekSHA256 string) (TPMEnrollment, error)
	// ListTPMEnrollments lists every enrollment, oldest first.
	ListTPMEnrollments(ctx context.Context) ([]TPMEnrollment, error)
	// RevokeTPMEnrollment removes an enrollment (ErrNotFound when there is
	// none); a machine's goes on its timeline.
	RevokeTPMEnrollment(ctx context.Context, ekSHA256 string, at time.Time) error
}

// PoolPolicies holds the pools' policies. A pool without one allows every
// attestor.
type PoolPolicies interface {
	// SetPoolPolicy stores (replaces) a pool's policy; one with no
	// attestors removes it.
	SetPoolPolicy(ctx context.Context, p PoolPolicy) error
	// GetPoolPolicy returns a pool's policy, or ErrNotFound for none.
	GetPoolPolicy(ctx context.Context, pool string) (PoolPolicy, error)
	// ListPoolPolicies lists the pools that have one, by name.
	ListPoolPolicies(ctx context.Context) ([]PoolPolicy, error)
}
