package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

const deployJSON = `{
  "image": {"url": "https://images.example/debian-12.raw.zst?sig=x", "sha256": "` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `",
            "size": 123456, "format": "raw.zst", "image_size": 2147483648},
  "target": {"serial": "S4EWNX0R"},
  "files": [
    {"path": "/etc/bcd/join-token", "mode": "0600", "uid": 0, "gid": 0, "content": "YmNqdF9zZWNyZXQ="},
    {"fs": "esp", "path": "/EFI/BOOT/grub.cfg", "mode": "644", "content": ""}
  ],
  "after": {"action": "kexec", "cmdline": "console=ttyS0"}
}`

func TestDeployImageParamsJSON(t *testing.T) {
	var p DeployImageParams
	if err := json.Unmarshal([]byte(deployJSON), &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Files[0].Mode != 0o600 || string(p.Files[0].Content) != "bcjt_secret" || p.Files[1].Mode != 0o644 {
		t.Errorf("files %#v", p.Files)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"mode":"0600"`) || !strings.Contains(string(b), `"content":"YmNqdF9zZWNyZXQ="`) {
		t.Errorf("marshalled %s", b)
	}
	var back DeployImageParams
	if err := json.Unmarshal(b, &back); err != nil || back.Files[0].Mode != 0o600 {
		t.Errorf("round trip: %v %+v", err, back.Files)
	}
	if s := p.Files[0].Content.String(); strings.Contains(s, "secret") {
		t.Errorf("content printed: %s", s)
	}
}

func TestDeployImageParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*DeployImageParams)
		want string
	}{
		{"ftp", func(p *DeployImageParams) { p.Image.URL = "ftp://x/y" }, "image.url"},
		{"upper sha", func(p *DeployImageParams) { p.Image.SHA256 = strings.ToUpper(p.Image.SHA256) }, "image.sha256"},
		{"no size", func(p *DeployImageParams) { p.Image.Size = 0 }, "image.size"},
		{"compressed without image_size", func(p *DeployImageParams) { p.Image.ImageSize = 0 }, "image_size: required"},
		{"raw with other image_size", func(p *DeployImageParams) { p.Image.Format = FormatRaw }, "differs from image.size"},
		{"bad format", func(p *DeployImageParams) { p.Image.Format = "vmdk" }, "image.format"},
		{"serial and path", func(p *DeployImageParams) { p.Target.Path = "/dev/sda" }, "not both"},
		{"relative path", func(p *DeployImageParams) { p.Target = DeployTarget{Path: "sda"} }, "absolute"},
		{"dot dot", func(p *DeployImageParams) { p.Files[0].Path = "/etc/../root/x" }, "clean path"},
		{"space", func(p *DeployImageParams) { p.Files[0].Path = "/etc/a b" }, "not allowed"},
		{"quote", func(p *DeployImageParams) { p.Files[0].Path = `/etc/a"b` }, "not allowed"},
		{"twice", func(p *DeployImageParams) { p.Files[1] = p.Files[0] }, "given twice"},
		{"esp twice by case", func(p *DeployImageParams) { p.Files[0] = p.Files[1]; p.Files[0].Path = "/efi/boot/GRUB.CFG" }, "given twice"},
		{"bad fs", func(p *DeployImageParams) { p.Files[0].FS = "home" }, "files[0].fs"},
		{"negative uid", func(p *DeployImageParams) { p.Files[0].UID = -1 }, "uid"},
		{"bad action", func(p *DeployImageParams) { p.After.Action = "halt" }, "after.action"},
		{"initrd alone", func(p *DeployImageParams) { p.After.Initrd = "/boot/initrd" }, "after.initrd"},
		{"cmdline newline", func(p *DeployImageParams) { p.After.Cmdline = "a\nb" }, "after.cmdline"},
		{"proxy", func(p *DeployImageParams) { p.Proxy = "socks5://x" }, "proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p DeployImageParams
			if err := json.Unmarshal([]byte(deployJSON), &p); err != nil {
				t.Fatal(err)
			}
			tc.edit(&p)
			if err := p.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
	for _, bad := range []string{`"600a"`, `"99999"`, `384`} {
		var m FileMode
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("mode %s accepted", bad)
		}
	}
}

func FuzzDeployImageParams(f *testing.F) {
	f.Add([]byte(deployJSON))
	f.Add([]byte(`{"image":{"url":"http://x","sha256":"","size":1},"files":[{"path":"/a","mode":"7777"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p DeployImageParams
		if json.Unmarshal(b, &p) != nil || p.Validate() != nil {
			return
		}
		for _, file := range p.Files {
			if ValidDeployPath(file.Path) != nil || file.Mode > 0o7777 || strings.ContainsAny(file.Path, " \"\\\n") {
				t.Fatalf("accepted file %q mode %o", file.Path, uint32(file.Mode))
			}
		}
		if strings.ContainsAny(p.After.Cmdline, "\n\r\x00") {
			t.Fatalf("accepted cmdline %q", p.After.Cmdline)
		}
	})
}

// TestDeployImageResultJSON: a result reads the same in today's names and in those
// of an older ramdisk, and today's names win where both are present.
func TestDeployImageResultJSON(t *testing.T) {
	want := DeployImageResult{Target: DeployTarget{Path: "/dev/vda", Serial: "S1"}, ImageSize: 2048, Size: 1024,
		SHA256: "ab", DurationMS: 5, After: AfterKexec}
	for _, tc := range []struct {
		name, json string
		want       DeployImageResult
	}{
		{"today", `{"target":{"path":"/dev/vda","serial":"S1"},"image_size":2048,"size":1024,"sha256":"ab","duration_ms":5,"after":"kexec"}`, want},
		{"older ramdisk", `{"disk":"/dev/vda","disk_serial":"S1","bytes_written":2048,"bytes_received":1024,"sha256":"ab","duration_ms":5,"after":"kexec"}`, want},
		{"both", `{"target":{"path":"/dev/vda","serial":"S1"},"disk":"/dev/old","image_size":2048,"bytes_written":1,"size":1024,"bytes_received":1,"sha256":"ab","duration_ms":5,"after":"kexec"}`, want},
		{"no serial", `{"disk":"/tmp/img","bytes_written":3,"bytes_received":3,"after":"none"}`,
			DeployImageResult{Target: DeployTarget{Path: "/tmp/img"}, ImageSize: 3, Size: 3, After: AfterNone}},
	} {
		var got DeployImageResult
		if err := json.Unmarshal([]byte(tc.json), &got); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if g, w := mustJSON(t, got), mustJSON(t, tc.want); g != w {
			t.Errorf("%s: got %s, want %s", tc.name, g, w)
		}
	}
	if b := mustJSON(t, want); strings.Contains(b, "bytes_written") || strings.Contains(b, `"disk"`) {
		t.Errorf("written with the old names: %s", b)
	}
}

// FuzzDeployImageResult: the control plane decodes what a ramdisk sends; whatever
// decodes writes out and reads back the same.
func FuzzDeployImageResult(f *testing.F) {
	f.Add(`{"target":{"path":"/dev/vda"},"image_size":2048,"size":1024,"after":"kexec"}`)
	f.Add(`{"disk":"/dev/vda","disk_serial":"S1","bytes_written":2048,"bytes_received":1024}`)
	f.Add(`{"target":null,"disk":7}`)
	f.Fuzz(func(t *testing.T, s string) {
		var r DeployImageResult
		if json.Unmarshal([]byte(s), &r) != nil {
			return
		}
		b := mustJSON(t, r)
		var again DeployImageResult
		if err := json.Unmarshal([]byte(b), &again); err != nil {
			t.Fatalf("%s does not read back: %v", b, err)
		}
		if b2 := mustJSON(t, again); b2 != b {
			t.Fatalf("round trip %s != %s", b2, b)
		}
	})
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
