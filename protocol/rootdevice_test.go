package protocol

import (
	"strings"
	"testing"
)

func TestParseRootDevice(t *testing.T) {
	tr, fa := true, false
	for _, tc := range []struct {
		in      string
		check   func(RootDeviceHints) bool
		wantErr string
	}{
		{"serial=S1", func(h RootDeviceHints) bool { return h.Serial == "S1" }, ""},
		{"serial=X,size>=100GiB,rotational=false", func(h RootDeviceHints) bool {
			return h.Serial == "X" && h.SizeOp == ">=" && h.Size == 100<<30 && h.Rotational != nil && *h.Rotational == fa
		}, ""},
		{"size<=2TB", func(h RootDeviceHints) bool { return h.SizeOp == "<=" && h.Size == 2e12 }, ""},
		{"size=4096", func(h RootDeviceHints) bool { return h.SizeOp == "=" && h.Size == 4096 }, ""},
		{"size>=1.5GiB", func(h RootDeviceHints) bool { return h.Size == 3<<29 }, ""},
		{" wwn = 0x5000c500a1b2c3d4 , model=QEMU HARDDISK", func(h RootDeviceHints) bool {
			return h.WWN == "0x5000c500a1b2c3d4" && h.Model == "QEMU HARDDISK"
		}, ""},
		{"vendor=ATA,rotational=1", func(h RootDeviceHints) bool { return h.Vendor == "ATA" && *h.Rotational == tr }, ""},
		{"name=/dev/sdb", func(h RootDeviceHints) bool { return h.Name == "/dev/sdb" }, ""},
		{"by-path=/dev/disk/by-path/pci-0000:00:05.0", func(h RootDeviceHints) bool { return h.ByPath == "/dev/disk/by-path/pci-0000:00:05.0" }, ""},
		{"", nil, "empty"},
		{"serial", nil, `hint "serial": want key=value`},
		{"serial=S1,", nil, "an empty hint"},
		{"colour=red", nil, `unknown key "colour"`},
		{"serial>=S1", nil, "only size takes >="},
		{"size>=lots", nil, `hint "size>=lots"`},
		{"size>=10PB", nil, `hint "size>=10PB"`},
		{"size>=99999999999TiB", nil, "too large"},
		{"rotational=maybe", nil, `hint "rotational=maybe": want true or false`},
		{"serial=A,serial=B", nil, "serial given twice"},
		{"name=/dev/disk/by-id/x", nil, "want sdX or /dev/sdX"},
		{"by_path=/dev/sda", nil, "by-path/ link"},
		{"serial=", nil, "empty value"},
	} {
		h, err := ParseRootDevice(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !tc.check(h) {
			t.Errorf("%q: %+v, %v", tc.in, h, err)
		}
	}
}

func TestDeployTargetRootDevice(t *testing.T) {
	base := func() DeployImageParams {
		return DeployImageParams{Image: DeployImage{URL: "https://h/i", SHA256: strings.Repeat("0", 64), Size: 1, Format: FormatRaw},
			After: DeployAfter{Action: AfterNone}}
	}
	for _, tc := range []struct {
		target  DeployTarget
		wantErr string
	}{
		{DeployTarget{RootDevice: "serial=S1,size>=1GiB"}, ""},
		{DeployTarget{RootDevice: "serial=S1", FirstMatch: true}, ""},
		{DeployTarget{RootDevice: "size>=big"}, `target.root_device: root device hint "size>=big"`},
		{DeployTarget{RootDevice: "serial=S1", Serial: "S1"}, "not two"},
		{DeployTarget{FirstMatch: true}, "only with target.root_device"},
	} {
		p := base()
		p.Target = tc.target
		err := p.Validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: %v, want %q", tc.target, err, tc.wantErr)
		}
	}
}

// FuzzParseRootDevice: any input parses or fails with an error naming a hint,
// never panics, and what parses prints back as hints that parse to the same.
func FuzzParseRootDevice(f *testing.F) {
	for _, s := range []string{"serial=X,size>=100GiB,rotational=false", "size<=1.5TB", "wwn=0x5", "name=sda,by_path=/dev/disk/by-path/a", "a=b=c", ",,", "size>=9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseRootDevice(s)
		if err != nil {
			if !strings.Contains(err.Error(), "root device hint") {
				t.Fatalf("%q: error %v does not say root device hint", s, err)
			}
			return
		}
		if h.Size < 0 {
			t.Fatalf("%q: size %d", s, h.Size)
		}
		h2, err := ParseRootDevice(h.String())
		if err != nil || h2.String() != h.String() || h2.Size != h.Size || h2.Serial != h.Serial {
			t.Fatalf("%q: %q reparsed as %+v, %v", s, h.String(), h2, err)
		}
	})
}
