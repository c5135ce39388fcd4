package ipxe

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestFind(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "ipxe")
	os.Mkdir(root, 0o755)
	os.WriteFile(filepath.Join(root, BIOS), []byte("kpxe"), 0o644)
	os.WriteFile(filepath.Join(root, SNPOnly), nil, 0o644) // empty: a failed copy
	os.WriteFile(filepath.Join(dir, "outside.efi"), []byte("efi"), 0o644)
	os.Symlink("../outside.efi", filepath.Join(root, EFI)) // leaves the root
	os.Mkdir(filepath.Join(root, ARM64), 0o755)            // a directory
	present, missing, err := Find(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(present, []string{BIOS}) || !slices.Equal(missing, []string{EFI, SNPOnly, ARM64}) {
		t.Errorf("present %v missing %v", present, missing)
	}
	present, missing, err = Find(root, BIOS)
	if err != nil || len(present) != 1 || len(missing) != 0 {
		t.Errorf("Find(root, BIOS) = %v %v %v", present, missing, err)
	}
	if _, _, err := Find(filepath.Join(dir, "absent")); err == nil {
		t.Error("Find of a missing directory succeeded")
	}
}
