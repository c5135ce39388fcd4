package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/better-compute/bcd/controlplane/store"
)

// schemaImages adds the image catalog (store.Images). url may be sealed
// (store.SecretImageURL).
const schemaImages = `
CREATE TABLE images (
	name       TEXT PRIMARY KEY,
	url        TEXT NOT NULL,
	sha256     TEXT NOT NULL,
	size       INTEGER NOT NULL,
	format     TEXT NOT NULL DEFAULT '',
	image_size INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
`

const imageColumns = `name, url, sha256, size, format, image_size, created_at`

func scanImage(sc interface{ Scan(...any) error }) (store.Image, error) {
	var im store.Image
	var created sql.NullInt64
	if err := sc.Scan(&im.Name, &im.Image.URL, &im.Image.SHA256, &im.Image.Size, &im.Image.Format, &im.Image.ImageSize, &created); err != nil {
		return store.Image{}, err
	}
	im.CreatedAt = fromMS(created)
	return im, nil
}

func (s *sqliteStore) AddImage(ctx context.Context, im store.Image) error {
	_, err := s.exec(ctx, `INSERT INTO images (`+imageColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		im.Name, im.Image.URL, im.Image.SHA256, im.Image.Size, im.Image.Format, im.Image.ImageSize, ms(im.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("store: image %q: %w", im.Name, store.ErrExists)
	}
	return wrap("add image", err)
}

func (s *sqliteStore) GetImage(ctx context.Context, name string) (store.Image, error) {
	im, err := scanImage(s.r.QueryRowContext(ctx, `SELECT `+imageColumns+` FROM images WHERE name = ?`, name))
	return im, wrap(fmt.Sprintf("image %q", name), err)
}

func (s *sqliteStore) ListImages(ctx context.Context) ([]store.Image, error) {
	return queryAll(ctx, s.r, "list images", scanImage, `SELECT `+imageColumns+` FROM images ORDER BY name`)
}

func (s *sqliteStore) DeleteImage(ctx context.Context, name string) error {
	res, err := s.exec(ctx, `DELETE FROM images WHERE name = ?`, name)
	if err == nil {
		var n int64
		if n, err = rowsAffected(res); err == nil && n != 1 {
			err = store.ErrNotFound
		}
	}
	return wrap(fmt.Sprintf("delete image %q", name), err)
}
