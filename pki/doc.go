// Package pki holds the control plane's PKI bundle and the crypto both sides
// of bcd share: SPKI pins, JWKs, sealed join tokens (JWE), purpose-bound
// signatures (JWS) and the certificates of the api, the gateway and the nodes.
//
// # The bundle
//
// Init (better-compute pki init DIR) makes a directory, mode 0700, holding
// ECDSA P-256 keys and the secrets keyring:
//
//	serving-ca.key       0600  serving CA key (PKCS#8 PEM): signs the api/gateway TLS certificates
//	serving-ca.crt       0644  serving CA certificate, self-signed, 10 years
//	join-signing.key     0600  signs join responses and other JWS, each for one purpose
//	join-encryption.key  0600  opens join tokens sealed by bcd join
//	join-encryption.jwk  0644  its public key as a JWK, written beside config.toml on machines
//	node-ca.key          0600  node CA key: signs node client certificates
//	node-ca.crt          0644  node CA certificate, self-signed, 10 years, URI-constrained to the trust domain
//	public.json          0644  the shareable half: trust domain, the three pins, the JWK, both CA
//	                           certificates and the join signing public key
//	secrets.key          0600  the AES-256-GCM keyring serve seals stored secrets under (Keyring;
//	                           made at serve's first start for a bundle older than it)
//	secrets.key.lock     0600  its flock: shared by each serve, exclusive for a rotation
//
// A Keyring seals a value under its primary key as "sealed:v1:<key id>:<base64>"
// and opens it under any key it holds, so a rotation (Rotate, reseal, Retire)
// never leaves a value it cannot open. The site agent keeps one too
// (bmc-hosts.key, for bmc-hosts.json).
//
// public.json is written last and is all LoadPublic reads, so the install
// script generator and the well-known document need no secret. LoadBundle
// reads everything, refuses private key files that group or others can
// access, and checks every file against public.json.
//
// # Pins
//
// A pin is "sha256/" and the standard base64 of the SHA-256 of a DER
// SubjectPublicKeyInfo, as curl --pinnedpubkey and HPKP use. Agents are
// installed with three: the serving CA (the gateway's TLS chain must contain
// it), the join signing key (join responses are verified under it) and the
// join encryption key (a JWK is used to seal the token only if it hashes to
// this pin).
//
// # Identities
//
// A node certificate carries exactly one URI SAN,
// spiffe://<trust-domain>/<role>/<node-id>, with role node, site or ramdisk
// and a node ID of 1 to 64 characters of [a-z0-9_-]. The node CA carries a
// URI name constraint for its trust domain, so verifiers refuse any other.
//
// # JOSE
//
// Algorithms are fixed, never negotiated: JWE is ECDH-ES+A256KW with
// A256GCM, JWS is ES256 with a protected "bcd-purpose" header that Verify
// requires to match exactly, so a signature made for one purpose cannot be
// replayed as another. Signers embed their public JWK, which VerifyPinned
// accepts only when it matches a pin. Inputs are size-bounded before parsing.
package pki
