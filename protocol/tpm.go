package protocol

// The tpm attestor's join runs in two rounds, as google/go-attestation's
// enrollment does:
//
//  1. The agent makes its node key in the TPM, an attestation key (AK) under
//     the endorsement hierarchy, and TPM2_Certify of the node key by the AK
//     with the SHA-256 of its CSR as qualifying data; it sends them with the
//     EK in JoinRequest.TPM. The JoinService checks the certification (the
//     CSR's key is a non-restricted signing key that cannot leave the TPM,
//     certified by a restricted AK) and the EK's policy (enrolled, or a
//     machine's that the operator approves), then answers a TPMChallenge: a
//     secret sealed to the EK for that AK name (TPM2_MakeCredential).
//  2. Only the TPM holding both the EK and the AK can recover the secret
//     (TPM2_ActivateCredential). The agent sends the same request again with
//     the challenge's ID and the secret; the JoinService admits it.
//
// The challenge ID is sealed to the control plane's own join encryption key
// (secret, CSR hash, AK name hash, expiry), so any replica can check round
// two and nothing is stored between the rounds.

// TPMAttestation is a tpm join's evidence. Binary fields are standard
// base64.
type TPMAttestation struct {
	// EKPublic is the endorsement key's PKIX DER; EKCert its certificate's
	// DER where the TPM has one.
	EKPublic string `json:"ek_public"`
	EKCert   string `json:"ek_cert,omitempty"`
	// AKPublic is the attestation key's TPMT_PUBLIC, marshalled.
	AKPublic string `json:"ak_public"`
	// CertifyInfo and CertifySignature are TPM2_Certify's TPMS_ATTEST and
	// TPMT_SIGNATURE (marshalled) of the node key by the AK, with the raw
	// SHA-256 of the CSR's DER as qualifying data.
	CertifyInfo      string `json:"certify_info"`
	CertifySignature string `json:"certify_signature"`
	// ChallengeID and Secret are round two's: the TPMChallenge's ID and the
	// secret ActivateCredential recovered from it.
	ChallengeID string `json:"challenge_id,omitempty"`
	Secret      string `json:"secret,omitempty"`
}

// TPMChallenge is round one's answer (JoinResponse.TPMChallenge).
type TPMChallenge struct {
	ID string `json:"id"`
	// CredentialBlob and EncryptedSecret are TPM2_MakeCredential's
	// TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET contents, standard base64.
	CredentialBlob  string `json:"credential_blob"`
	EncryptedSecret string `json:"encrypted_secret"`
	// ExpiresAt is when round two stops being accepted (unix seconds).
	ExpiresAt int64 `json:"expires_at"`
}

// TPMChallengeLifetime bounds the time between a tpm join's two rounds.
const TPMChallengeLifetime = 5 * 60 // seconds

// PurposeTPMChallenge names what a sealed TPMChallenge.ID holds (its
// payload's purpose field), so no other sealed value passes for one.
const PurposeTPMChallenge = "tpm-challenge"
