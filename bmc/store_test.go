package bmc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/protocol"
)

const secret = "Sup3r-s3cret!"

var section = protocol.BMCHostsSection{Hosts: []protocol.BMCHost{
	{Machine: "m-2", Address: "10.0.0.12", Username: "ADMIN", Password: secret, CipherSuite: 17},
	{Machine: "m-1", Address: "bmc-1.example.net", Port: 6230, Username: "admin", Password: secret, Driver: "ipmi", CipherSuite: 3},
}}

func TestStoreKeepsHostsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Machines()) != 0 {
		t.Fatalf("a new store has %v", s.Machines())
	}
	if err := s.Apply(section); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, HostsFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("bmc-hosts.json has mode %04o, want 0600", fi.Mode().Perm())
	}
	// No temporary file is left beside it and its key.
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("data dir holds %v", entries)
	}

	again, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"m-1", "m-2"}, again.Machines()); diff != "" {
		t.Errorf("machines after reopening (-want +got):\n%s", diff)
	}
	h, driver, ok := again.Lookup("m-1")
	want := Host{Name: "m-1", Address: "bmc-1.example.net", Port: 6230, Username: "admin", Password: secret, CipherSuite: 3}
	if !ok || driver != protocol.BMCDriverIPMI || h != want {
		t.Errorf("Lookup(m-1) = %s %q %v", h, driver, ok)
	}
	if _, driver, _ := again.Lookup("m-2"); driver != protocol.BMCDriverIPMI {
		t.Errorf("an entry without a driver has driver %q, want ipmi", driver)
	}

	// A new section replaces the old one whole.
	if err := again.Apply(protocol.BMCHostsSection{Hosts: section.Hosts[:1]}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := again.Lookup("m-1"); ok {
		t.Error("m-1 survived a section without it")
	}
	third, err := OpenStore(dir)
	if err != nil || len(third.Machines()) != 1 {
		t.Errorf("after replacing: %v %v", third.Machines(), err)
	}
}

// TestStoreSealsPasswords: bmc-hosts.json holds no password in the clear, only
// sealed under bmc-hosts.key (0600, created on first use); a file from before
// sealing (version 1) is read once and rewritten sealed.
func TestStoreSealsPasswords(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(section); err != nil {
		t.Fatal(err)
	}
	noPassword := func(when string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, HostsFile))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secret) || !strings.Contains(string(b), `"machine": "m-1"`) {
			t.Errorf("%s: bmc-hosts.json is\n%s", when, b)
		}
	}
	noPassword("after Apply")
	if fi, err := os.Stat(filepath.Join(dir, HostsKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("bmc-hosts.key: %v %v, want mode 0600", fi, err)
	}

	old := t.TempDir()
	b, _ := json.Marshal(hostsFile{Version: 1, Hosts: section.Hosts})
	if err := os.WriteFile(filepath.Join(old, HostsFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	dir = old
	s, err = OpenStore(old)
	if err != nil {
		t.Fatal(err)
	}
	noPassword("after opening a version 1 file")
	for _, st := range []*Store{s, must(OpenStore(old))} {
		if h, _, ok := st.Lookup("m-2"); !ok || string(h.Password) != secret {
			t.Errorf("Lookup(m-2) after the rewrite: %v %v", h, ok)
		}
	}
}

func must(s *Store, err error) *Store {
	if err != nil {
		panic(err)
	}
	return s
}

func TestStoreRefusesReadableFile(t *testing.T) {
	dir := t.TempDir()
	b, _ := json.Marshal(hostsFile{Version: 1, Hosts: section.Hosts})
	path := filepath.Join(dir, HostsFile)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	_, err := OpenStore(dir)
	if err == nil || !strings.Contains(err.Error(), "mode 0644") || !strings.Contains(err.Error(), "must be 0600") {
		t.Errorf("OpenStore of a 0644 file: %v", err)
	}
}

func TestStoreRefusesBadFiles(t *testing.T) {
	for _, c := range []struct {
		name, content, want string
	}{
		{"not json", `{"version":1,"hosts":[{"machine":"m","password":"` + secret + `"`, "not valid JSON"},
		{"future version", `{"version":3,"hosts":[]}`, "has version 3"},
		{"sealed under another key", `{"version":2,"hosts":[{"machine":"m","address":"h","username":"u","password":"sealed:v1:0011223344556677:AAAA"}]}`, `no key "0011223344556677"`},
		{"bad entry", `{"version":1,"hosts":[{"machine":"m","address":"a b","username":"u","password":"` + secret + `"}]}`, `address "a b"`},
		{"wrong type", `{"version":1,"hosts":[{"machine":"m","address":"h","username":"u","password":7}]}`, "must be string"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, HostsFile), []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := OpenStore(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the password: %v", c.name, err)
		}
	}
}

func TestParseHostsSection(t *testing.T) {
	raw, _ := json.Marshal(section)
	sec, err := ParseHostsSection(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(section, sec); diff != "" {
		t.Errorf("(-sent +parsed):\n%s", diff)
	}
	for _, c := range []struct {
		name, raw, want string
	}{
		{"twice", `{"hosts":[{"machine":"m","address":"h","username":"u"},{"machine":"m","address":"h","username":"u"}]}`, "listed twice"},
		{"suite", `{"hosts":[{"machine":"m","address":"h","username":"u","cipher_suite":1}]}`, "cipher_suite 1"},
		{"driver", `{"hosts":[{"machine":"m","address":"h","username":"u","driver":"redfish"}]}`, `driver "redfish"`},
		{"long password", `{"hosts":[{"machine":"m","address":"h","username":"u","password":"` + strings.Repeat("x", 21) + `"}]}`, "at most 20"},
		{"control character", `{"hosts":[{"machine":"m","address":"h","username":"u","password":"a\u0007b"}]}`, "printable"},
		{"no username", `{"hosts":[{"machine":"m","address":"h"}]}`, "username"},
		{"port", `{"hosts":[{"machine":"m","address":"h","username":"u","port":70000}]}`, "port 70000"},
		{"address with port", `{"hosts":[{"machine":"m","address":"h:623","username":"u"}]}`, "no port"},
		{"machine", `{"hosts":[{"machine":"a/b","address":"h","username":"u"}]}`, "machine must be"},
		{"syntax", `{"hosts":[{"password":"` + secret, "not valid JSON"},
	} {
		_, err := ParseHostsSection([]byte(c.raw))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzParseHostsSection: the section comes from the control plane. Whatever it
// holds, parsing never panics, and an error never quotes a password.
func FuzzParseHostsSection(f *testing.F) {
	raw, _ := json.Marshal(section)
	f.Add(raw)
	f.Add([]byte(`{"hosts":[{"machine":"m","address":"h","username":"u","password":"` + secret + `","port":-1}]}`))
	f.Add([]byte(`{"hosts":[{"password":"` + secret))
	f.Add([]byte(`{"hosts":[{"machine":"m","address":"` + secret + `"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sec, err := ParseHostsSection(data)
		if err != nil {
			var probe struct {
				Hosts []protocol.BMCHost `json:"hosts"`
			}
			if json.Unmarshal(data, &probe) == nil {
				// Other fields are named in errors; a password that is also in one
				// of them proves nothing.
				var others strings.Builder
				for _, h := range probe.Hosts {
					fmt.Fprintf(&others, "%s\x00%s\x00%s\x00%s\x00%d\x00%d\x00", h.Machine, h.Address, h.Username, h.Driver, h.Port, h.CipherSuite)
				}
				for _, h := range probe.Hosts {
					if len(h.Password) >= 4 && strings.Contains(err.Error(), h.Password) && !strings.Contains(others.String(), h.Password) {
						t.Fatalf("error %q quotes the password %q", err, h.Password)
					}
				}
			}
			return
		}
		if err := sec.Validate(); err != nil {
			t.Fatalf("a parsed section does not validate: %v", err)
		}
	})
}
