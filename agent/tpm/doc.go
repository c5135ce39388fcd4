// Package tpm keeps a node's keys in its TPM 2.0 and answers the TPM's part of a
// join.
//
// The node key (CreateNodeKey, LoadNodeKey) is a P-256 ECDSA signing key made under
// a primary key that the TPM re-derives from the owner hierarchy's seed with a fixed
// template, so nothing is persisted in the TPM's NV and the key survives reboots:
// node.key holds only its record, a PEM block "BCD TPM NODE KEY". *Key is a
// crypto.Signer, so TLS client authentication and CSRs use it unchanged.
//
// For the tpm attestor the package reads the endorsement key and its certificate
// (EK), makes an attestation key under the endorsement hierarchy (CreateAK), has it
// certify the node key (Certify), and answers the control plane's credential
// challenge (ActivateCredential), which proves the AK lives in the TPM with that EK.
// The verifier's side is pki/tpmattest.
//
// Open opens the kernel's resource manager (/dev/tpmrm0); OpenTCP opens swtpm's TCP
// command port, for tests and the QEMU lab. Errors name the TPM step that failed.
package tpm
