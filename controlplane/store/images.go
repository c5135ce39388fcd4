package store

import (
	"context"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// Image is an entry of the image catalog: a name for an image's URL,
// digest, size and format, so `machines deploy M --image NAME` does not
// repeat them. A deployment copies the entry's fields when it starts
// (DeploySpec.Image), so deleting or re-adding an entry never changes a
// deployment that used it.
type Image struct {
	// Name is unique per control plane (protocol.ValidName).
	Name string `json:"name"`
	// Image is what a deploy by this name installs. Its URL may carry a
	// credential (userinfo, a presigned query): SecretImageURL.
	Image     protocol.DeployImage `json:"image"`
	CreatedAt time.Time            `json:"created_at"`
}

// Images holds the image catalog.
type Images interface {
	// AddImage stores im; a name taken is ErrExists.
	AddImage(ctx context.Context, im Image) error
	// GetImage returns the entry of name, or ErrNotFound.
	GetImage(ctx context.Context, name string) (Image, error)
	// ListImages returns every entry, by name.
	ListImages(ctx context.Context) ([]Image, error)
	// DeleteImage removes the entry of name (ErrNotFound when there is
	// none). Deployments that used it keep their copy of its fields.
	DeleteImage(ctx context.Context, name string) error
}
