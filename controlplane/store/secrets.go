package store

import "context"

// SecretField names a stored value that may hold a secret. An implementation
// stores such values as it is given them; store/sealed is what seals them, and
// SecretRewriter lets it reseal what is stored.
type SecretField string

// The stored values that may hold a secret.
const (
	// SecretBMCPassword is a machine's MachineBMC.Password.
	SecretBMCPassword SecretField = "bmc password"
	// SecretCommandParams is a command's Params (a deploy.image's join
	// token and image URL).
	SecretCommandParams SecretField = "command params"
	// SecretDeploySpec is a deployment's Spec as JSON (its image URL).
	SecretDeploySpec SecretField = "deploy spec"
	// SecretImageURL is an image catalog entry's Image.URL.
	SecretImageURL SecretField = "catalog image url"
)

// SecretRewriter is an implementation's way to reseal what it stores.
type SecretRewriter interface {
	// RewriteSecrets passes every stored non-empty value of each
	// SecretField to fn, and stores what fn returns where it differs, all
	// in one transaction: an error stores none of it. It reports how many
	// values it changed.
	RewriteSecrets(ctx context.Context, fn func(f SecretField, value string) (string, error)) (int, error)
}
