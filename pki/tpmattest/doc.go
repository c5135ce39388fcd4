// Package tpmattest is the verifier's side of a TPM join: it checks what a node's
// TPM produced, without a TPM.
//
// The control plane uses it to challenge an attestation key (AK) with
// MakeCredential, so that only the TPM holding the endorsement key (EK) can answer
// (ActivateCredential, in agent/tpm); to check that an AK is a restricted signing key
// that never leaves its TPM (ParseAKPublic); and to check the AK's certification of
// the node key (VerifyCertify), which proves that the key named in the node's CSR
// lives in the same TPM. EKSHA256 gives the form in which an operator enrolls an EK.
//
// The package is pure Go: it imports go-tpm's structures and marshalling, never a
// device, and builds without cgo.
package tpmattest
