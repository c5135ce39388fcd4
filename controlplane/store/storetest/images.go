package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// testImages: the catalog stores entries by a name unique per control
// plane, returns them whole, lists them by name, and deletes one (a name
// given twice is ErrExists, an unknown name ErrNotFound).
func testImages(t *testing.T, s store.Store) {
	at := time.Now().UTC().Truncate(time.Millisecond)
	debian := store.Image{Name: "debian-12", CreatedAt: at, Image: protocol.DeployImage{
		URL: "https://user:pass@images.example.test/debian-12.raw.zst?X-Amz-Signature=abc", SHA256: strings.Repeat("ab", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}}
	alma := store.Image{Name: "alma-9", CreatedAt: at.Add(time.Second), Image: protocol.DeployImage{
		URL: "https://images.example.test/alma-9.raw", SHA256: strings.Repeat("cd", 32), Size: 2 << 30, Format: protocol.FormatRaw}}
	if ims, err := s.ListImages(ctx); err != nil || len(ims) != 0 {
		t.Fatalf("ListImages of an empty store = %+v, %v", ims, err)
	}
	for _, im := range []store.Image{debian, alma} {
		if err := s.AddImage(ctx, im); err != nil {
			t.Fatalf("AddImage %s: %v", im.Name, err)
		}
	}
	again := alma
	again.Image.URL = "https://elsewhere.example.test/x.raw"
	if err := s.AddImage(ctx, again); !errors.Is(err, store.ErrExists) {
		t.Fatalf("AddImage of a name taken: %v, want ErrExists", err)
	}
	got, err := s.GetImage(ctx, "debian-12")
	if err != nil || got != debian {
		t.Fatalf("GetImage = %+v, %v; want %+v", got, err, debian)
	}
	if _, err := s.GetImage(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetImage of an unknown name: %v, want ErrNotFound", err)
	}
	ims, err := s.ListImages(ctx)
	if err != nil || len(ims) != 2 || ims[0] != alma || ims[1] != debian {
		t.Fatalf("ListImages = %+v, %v; want alma-9 then debian-12, whole", ims, err)
	}
	if err := s.DeleteImage(ctx, "alma-9"); err != nil {
		t.Fatalf("DeleteImage: %v", err)
	}
	if err := s.DeleteImage(ctx, "alma-9"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteImage again: %v, want ErrNotFound", err)
	}
	if _, err := s.GetImage(ctx, "alma-9"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetImage after the delete: %v, want ErrNotFound", err)
	}
	// The name is free again.
	if err := s.AddImage(ctx, again); err != nil {
		t.Fatalf("AddImage after the delete: %v", err)
	}
	if ims, err := s.ListImages(ctx); err != nil || len(ims) != 2 || ims[0] != again {
		t.Fatalf("ListImages after re-adding = %+v, %v", ims, err)
	}
}
