package apitype

import (
	"strings"
	"testing"

	"github.com/better-compute/bcd/protocol"
)

// TestDeployCreateNormalizeValidate: the one place a deploy's defaults and
// checks live fills in after and pool, and refuses each bad field by name.
func TestDeployCreateNormalizeValidate(t *testing.T) {
	good := DeployCreate{Image: protocol.DeployImage{URL: "https://images.example.test/ubuntu.raw.zst", SHA256: strings.Repeat("AB", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}, Target: protocol.DeployTarget{Serial: "S123"}, Cmdline: "console=ttyS0"}
	d := good
	d.Normalize()
	if d.After != protocol.AfterKexec || d.Pool != DefaultPool || d.Image.SHA256 != strings.Repeat("ab", 32) {
		t.Errorf("normalized %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("a good deploy: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		mut        func(*DeployCreate)
	}{
		{"after none", "after", func(d *DeployCreate) { d.After = protocol.AfterNone }},
		{"after poweroff", "after", func(d *DeployCreate) { d.After = protocol.AfterPowerOff }},
		{"bad pool", "pool", func(d *DeployCreate) { d.Pool = "Pool A" }},
		{"http image", "image.url", func(d *DeployCreate) { d.Image.URL = "ftp://x/y" }},
		{"bad sha256", "image.sha256", func(d *DeployCreate) { d.Image.SHA256 = "nothex" }},
		{"no image size", "image.image_size", func(d *DeployCreate) { d.Image.ImageSize = 0 }},
		{"two disks", "target", func(d *DeployCreate) { d.Target.Path = "/dev/sda" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := good
			tc.mut(&bad)
			bad.Normalize()
			err := bad.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestDeployByImageName: a deploy by catalog name is checked without its
// image, refuses an image beside the name, and still checks the rest;
// Resolve makes it the deploy of the entry's image.
func TestDeployByImageName(t *testing.T) {
	d := DeployCreate{ImageName: "ubuntu-24.04", Target: protocol.DeployTarget{Serial: "S1"}}
	d.Normalize()
	if err := d.Validate(); err != nil {
		t.Fatalf("a deploy by name: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		mut        func(*DeployCreate)
	}{
		{"both", "give image_name or image, not both", func(d *DeployCreate) { d.Image.SHA256 = strings.Repeat("a", 64) }},
		{"bad name", "image_name", func(d *DeployCreate) { d.ImageName = "Ubuntu 24" }},
		{"two disks", "target", func(d *DeployCreate) { d.Target.Path = "/dev/sda" }},
		{"after poweroff", "after", func(d *DeployCreate) { d.After = protocol.AfterPowerOff }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := d
			tc.mut(&bad)
			if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error naming %s", err, tc.want)
			}
		})
	}
	img := protocol.DeployImage{URL: "https://images.example.test/u.raw", SHA256: strings.Repeat("a", 64), Size: 4096, Format: protocol.FormatRaw}
	r := d.Resolve(img)
	if r.ImageName != "" || r.Image != img || r.Target != d.Target || r.Validate() != nil {
		t.Errorf("resolved %+v", r)
	}
}
