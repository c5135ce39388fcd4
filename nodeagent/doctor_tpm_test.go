package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
)

// TestCheckTPM: the tpm check fails a [helper] node whose user is in the tss
// group (as a member or by its primary group) with the spec's message, and
// otherwise says where the node key is.
func TestCheckTPM(t *testing.T) {
	const tssMessage = "bcd is in the tss group: it can send the TPM any command (lock or clear its hierarchies); bcd helper holds the node keys, so remove it (gpasswd -d bcd tss) and restart bcd.service"
	const record = "-----BEGIN BCD TPM NODE KEY-----\nVersion: 1\n\nAAAA\n-----END BCD TPM NODE KEY-----\n"
	const pkcs8 = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	for _, tc := range []struct {
		name          string
		helper        bool
		group, passwd string
		key           string
		device        bool
		level         Level
		want          string
	}{
		{name: "helper user a tss member", helper: true, group: "tss:x:106:root,bcd\n", passwd: "bcd:x:999:999::/:/bin/false\n",
			level: Fail, want: tssMessage},
		{name: "helper user's primary group tss", helper: true, group: "tss:x:106:\n", passwd: "bcd:x:999:106::/:/bin/false\n",
			level: Fail, want: tssMessage},
		{name: "helper user not in tss", helper: true, group: "# groups\ntss:x:106:root\nbcd:x:999:\n", passwd: "bcd:x:999:999::/:/bin/false\n",
			key: record, device: true, level: OK, want: "the node key is in the TPM"},
		{name: "no helper: tss membership is not bcd's business", group: "tss:x:106:bcd\n", passwd: "",
			key: pkcs8, device: true, level: OK, want: "the node key is not in it"},
		{name: "a TPM record without the device", key: record, level: Fail, want: "the node key cannot be used"},
		{name: "no TPM", key: pkcs8, level: OK, want: "no TPM"},
		{name: "not joined, no TPM", level: OK, want: "no TPM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, s string) string {
				p := filepath.Join(dir, name)
				if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			}
			f := tpmFiles{Group: write("group", tc.group), Passwd: write("passwd", tc.passwd), Device: filepath.Join(dir, "tpmrm0")}
			if tc.device {
				write("tpmrm0", "")
			}
			data := filepath.Join(dir, "data")
			os.Mkdir(data, 0o700)
			if tc.key != "" {
				os.WriteFile(filepath.Join(data, "node.key"), []byte(tc.key), 0o600)
			}
			cfg := &config.Config{DataDir: data}
			if tc.helper {
				cfg.Helper = &config.Helper{User: "bcd"}
			}
			got := checkTPM(cfg, f)
			if got.Level != tc.level || !strings.Contains(got.Detail, tc.want) {
				t.Errorf("%v %q, want %v containing %q", got.Level, got.Detail, tc.level, tc.want)
			}
		})
	}
}
