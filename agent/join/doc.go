// Package join is bcd join, shared by every agent mode: it makes the node's P-256
// key and CSR, seals the join token to the pinned join encryption key, calls the
// gateway's POST /v1/join over TLS pinned to the serving CA, verifies the signed
// answer under the pinned join signing key (for our CSR, our key, the SPIFFE id and
// the role), and stores the identity under data_dir.
//
// Around that exchange (Client) it does what the command does (Run): read the token
// from BCD_JOIN_TOKEN, standard input or --token-file (whose rules are checked
// before a byte is read), answer "already joined as <node>" without a token, bootstrap
// from <server>/.well-known/better-compute when there is no config.toml, move an old
// identity aside for --reset, and move aside a journal an earlier identity left.
//
// The attestors join-token and provisioned are implemented; discovery is the
// ramdisk's and tpm is refused as not implemented, both without changing the flow:
// an attestor only changes what the request carries.
package join
