package lifecycle

import (
	"strings"
	"testing"
	"time"
)

func TestParseTimeouts(t *testing.T) {
	got, err := ParseTimeouts(" ramdisk=90s, deploy=45m,grace=5s ")
	if err != nil {
		t.Fatal(err)
	}
	want := Timeouts{Ramdisk: 90 * time.Second, Deploy: 45 * time.Minute, Grace: 5 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	full := got.WithDefaults()
	if full.BMC != DefaultBMCTimeout || full.Install != DefaultInstallTimeout || full.Ramdisk != 90*time.Second {
		t.Errorf("defaults %+v", full)
	}
	again, err := ParseTimeouts(full.String())
	if err != nil || again != full {
		t.Errorf("String %q reads back as %+v %v", full.String(), again, err)
	}
	if z, err := ParseTimeouts(""); err != nil || z != (Timeouts{}) {
		t.Errorf("empty: %+v %v", z, err)
	}
	for in, want := range map[string]string{
		"ramdisk":                "want key=duration",
		"=5m":                    "want key=duration",
		"boot=5m":                `unknown key "boot"`,
		"ramdisk=5m,ramdisk=6m":  "given twice",
		"deploy=soon":            "not a duration",
		"grace=0s":               "want more than 0",
		"grace=-1s":              "want more than 0",
		"install=25h":            "at most 24h0m0s",
		"ramdisk=5m,,deploy=10m": "want key=duration",
	} {
		if _, err := ParseTimeouts(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func FuzzParseTimeouts(f *testing.F) {
	for _, s := range []string{"", "ramdisk=10m", "bmc=2m,ramdisk=10m,inventory=2m,deploy=1h,install=15m,grace=1m", "deploy=1h30m5s",
		"x=1", "ramdisk=", ",", "grace=1ns", "ramdisk=10m,ramdisk=10m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTimeouts(s)
		if err != nil {
			return
		}
		for name, d := range got.fields() {
			if *d < 0 || *d > maxTimeout {
				t.Fatalf("%q: %s=%s is out of range", s, name, *d)
			}
		}
		full := got.WithDefaults()
		again, err := ParseTimeouts(full.String())
		if err != nil || again != full {
			t.Fatalf("%q: %q reads back as %+v, %v", s, full.String(), again, err)
		}
	})
}
