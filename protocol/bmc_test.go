package protocol

import (
	"strings"
	"testing"
)

func TestBMCParamsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"power ok", BMCPowerParams{Machine: "m-1", Action: PowerCycle}.Validate(), ""},
		{"power action", BMCPowerParams{Machine: "m-1", Action: "boom"}.Validate(), `action "boom"`},
		{"power machine", BMCPowerParams{Action: PowerOn}.Validate(), "machine"},
		{"bootdev ok", BMCBootdevParams{Machine: "m.1", Device: BootDeviceDisk, EFI: true}.Validate(), ""},
		{"bootdev device", BMCBootdevParams{Machine: "m", Device: "usb"}.Validate(), `device "usb"`},
		{"inventory ok", BMCInventoryParams{Machine: "M_1"}.Validate(), ""},
		{"inventory machine", BMCInventoryParams{Machine: "a b"}.Validate(), "machine"},
	} {
		switch {
		case c.want == "" && c.err != nil:
			t.Errorf("%s: %v", c.name, c.err)
		case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.name, c.err, c.want)
		}
	}
}

func TestBMCHostValidate(t *testing.T) {
	ok := BMCHost{Machine: "m-1", Address: "10.1.2.3", Username: "admin", Password: "pw"}
	for _, addr := range []string{"10.1.2.3", "fe80::1", "bmc-7.rack2.example.com", "BMC1"} {
		h := ok
		h.Address = addr
		if err := h.Validate(); err != nil {
			t.Errorf("address %q: %v", addr, err)
		}
	}
	for _, addr := range []string{"", "10.1.2.3:623", "http://bmc", "-bmc", "bmc.", "a..b", "bmc_1", strings.Repeat("a", 64) + ".com"} {
		h := ok
		h.Address = addr
		if err := h.Validate(); err == nil {
			t.Errorf("address %q accepted", addr)
		}
	}
	h := ok
	h.Password = "hunter2-but-longer-than-20"
	if err := h.Validate(); err == nil || strings.Contains(err.Error(), h.Password) {
		t.Errorf("long password: %v", err)
	}
}
