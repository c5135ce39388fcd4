package protocol

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// BMC drivers a bmc_hosts entry may name.
const BMCDriverIPMI = "ipmi" // IPMI v2.0 over LAN (RMCP+), through the bcx-ipmi plugin

// DefaultIPMIPort is the RMCP port a BMC listens on when an entry gives none.
const DefaultIPMIPort = 623

// IPMI cipher suites an entry may ask for. CipherSuiteAuto lets the driver take the
// strongest suite the BMC offers; some BMCs (OpenIPMI's ipmi_sim among them) only
// work with a suite named explicitly.
const (
	CipherSuiteAuto = 0
	CipherSuite3    = 3  // RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128
	CipherSuite17   = 17 // RAKP-HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128
)

// BMCHostsSection is a site's bmc_hosts section: the BMCs its machines have, with
// the credentials the site agent uses for them. The site keeps it in bmc-hosts.json
// (0600) under data_dir; the password never leaves the site agent other than to the
// BMC driver, over the plugin's channel.
type BMCHostsSection struct {
	Hosts []BMCHost `json:"hosts"`
}

// BMCHost is one machine's BMC.
type BMCHost struct {
	// Machine is the control plane's machine id; commands name the BMC by it.
	Machine string `json:"machine"`
	// Address is the BMC's IP address or host name, without a port.
	Address string `json:"address"`
	// Port is the RMCP port; 0 means DefaultIPMIPort.
	Port     int    `json:"port,omitempty"`
	Username string `json:"username"`
	Password string `json:"password"`
	// Driver names the plugin protocol; empty means BMCDriverIPMI.
	Driver string `json:"driver,omitempty"`
	// CipherSuite is CipherSuiteAuto, CipherSuite3 or CipherSuite17.
	CipherSuite int `json:"cipher_suite,omitempty"`
}

var machinePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// ValidMachine reports whether id may name a machine in a BMC command.
func ValidMachine(id string) bool { return machinePattern.MatchString(id) }

// Validate checks an entry as the site agent will use it. Its errors never quote the
// password.
func (h BMCHost) Validate() error {
	switch {
	case !ValidMachine(h.Machine):
		return fmt.Errorf("bmc host %q: machine must be 1-128 letters, digits, ., _ or -", h.Machine)
	case !validBMCAddress(h.Address):
		return fmt.Errorf("bmc host %s: address %q is not an IP address or host name (no port, no scheme)", h.Machine, h.Address)
	case h.Port < 0 || h.Port > 65535:
		return fmt.Errorf("bmc host %s: port %d is out of range", h.Machine, h.Port)
	case h.Username == "" || len(h.Username) > 16 || !printableASCII(h.Username):
		// IPMI v2.0 user names are at most 16 bytes.
		return fmt.Errorf("bmc host %s: username must be 1-16 printable ASCII characters", h.Machine)
	case len(h.Password) > 20 || !printableASCII(h.Password):
		// IPMI v2.0 passwords are at most 20 bytes.
		return fmt.Errorf("bmc host %s: password must be at most 20 printable ASCII characters", h.Machine)
	case h.Driver != "" && h.Driver != BMCDriverIPMI:
		return fmt.Errorf("bmc host %s: driver %q is not supported (only %q)", h.Machine, h.Driver, BMCDriverIPMI)
	case h.CipherSuite != CipherSuiteAuto && h.CipherSuite != CipherSuite3 && h.CipherSuite != CipherSuite17:
		return fmt.Errorf("bmc host %s: cipher_suite %d is not supported (0 for automatic, 3 or 17)", h.Machine, h.CipherSuite)
	}
	return nil
}

// Validate checks every entry and that no machine is listed twice.
func (s BMCHostsSection) Validate() error {
	seen := make(map[string]bool, len(s.Hosts))
	for _, h := range s.Hosts {
		if err := h.Validate(); err != nil {
			return err
		}
		if seen[h.Machine] {
			return fmt.Errorf("bmc host %s is listed twice", h.Machine)
		}
		seen[h.Machine] = true
	}
	return nil
}

func validBMCAddress(a string) bool {
	if net.ParseIP(a) != nil {
		return true
	}
	if a == "" || len(a) > 253 || strings.HasPrefix(a, "-") || strings.HasSuffix(a, ".") {
		return false
	}
	for _, label := range strings.Split(a, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Power actions of bmc.power.
const (
	PowerOn     = "on"     // power up; nothing happens to a machine that is on
	PowerOff    = "off"    // hard power off, without asking the OS
	PowerCycle  = "cycle"  // off, then on; a machine that is off is powered on
	PowerReset  = "reset"  // hard reset; a machine that is off is powered on
	PowerStatus = "status" // read the power state only
)

// Power states a BMC reports.
const (
	PowerStateOn  = "on"
	PowerStateOff = "off"
)

// BMCPowerParams are the params of a bmc.power command.
type BMCPowerParams struct {
	Machine string `json:"machine"`
	Action  string `json:"action"`
}

// Validate checks the machine id and the action.
func (p BMCPowerParams) Validate() error {
	if !ValidMachine(p.Machine) {
		return fmt.Errorf("bmc.power: machine %q is not a machine id", p.Machine)
	}
	switch p.Action {
	case PowerOn, PowerOff, PowerCycle, PowerReset, PowerStatus:
		return nil
	}
	return fmt.Errorf("bmc.power: action %q is not one of on, off, cycle, reset, status", p.Action)
}

// BMCPowerResult is the result of a SUCCEEDED bmc.power: the power state the BMC
// reported after the action (for status, the state itself).
type BMCPowerResult struct {
	Machine string `json:"machine"`
	Action  string `json:"action"`
	Power   string `json:"power"` // PowerStateOn or PowerStateOff
}

// Boot devices of bmc.bootdev.
const (
	BootDevicePXE  = "pxe"
	BootDeviceDisk = "disk"
)

// BMCBootdevParams are the params of a bmc.bootdev command: the device the machine
// boots from next, under UEFI or legacy BIOS, once or until changed.
type BMCBootdevParams struct {
	Machine    string `json:"machine"`
	Device     string `json:"device"`
	EFI        bool   `json:"efi,omitempty"`
	Persistent bool   `json:"persistent,omitempty"`
}

// Validate checks the machine id and the device.
func (p BMCBootdevParams) Validate() error {
	if !ValidMachine(p.Machine) {
		return fmt.Errorf("bmc.bootdev: machine %q is not a machine id", p.Machine)
	}
	if p.Device != BootDevicePXE && p.Device != BootDeviceDisk {
		return fmt.Errorf("bmc.bootdev: device %q is not pxe or disk", p.Device)
	}
	return nil
}

// BMCBootdevResult is the result of a SUCCEEDED bmc.bootdev: what was set.
type BMCBootdevResult struct {
	Machine    string `json:"machine"`
	Device     string `json:"device"`
	EFI        bool   `json:"efi,omitempty"`
	Persistent bool   `json:"persistent,omitempty"`
}

// BMCInventoryParams are the params of a bmc.inventory command.
type BMCInventoryParams struct {
	Machine string `json:"machine"`
}

// Validate checks the machine id.
func (p BMCInventoryParams) Validate() error {
	if !ValidMachine(p.Machine) {
		return fmt.Errorf("bmc.inventory: machine %q is not a machine id", p.Machine)
	}
	return nil
}

// BMCInventoryResult is what a BMC says about itself and its machine. Fields the BMC
// does not provide (many have no FRU data) are empty.
type BMCInventoryResult struct {
	Machine          string `json:"machine"`
	Power            string `json:"power,omitempty"`
	ManufacturerID   uint32 `json:"manufacturer_id,omitempty"` // IANA enterprise number
	ProductID        uint16 `json:"product_id,omitempty"`
	FirmwareRevision string `json:"firmware_revision,omitempty"`
	IPMIVersion      string `json:"ipmi_version,omitempty"`
	SystemGUID       string `json:"system_guid,omitempty"`
	BoardVendor      string `json:"board_vendor,omitempty"`
	BoardProduct     string `json:"board_product,omitempty"`
	BoardSerial      string `json:"board_serial,omitempty"`
	ProductVendor    string `json:"product_vendor,omitempty"`
	ProductName      string `json:"product_name,omitempty"`
	ProductSerial    string `json:"product_serial,omitempty"`
	ChassisSerial    string `json:"chassis_serial,omitempty"`
}

// Reasons a FAILED bmc.* status carries.
const (
	ReasonBMCUnknownMachine = "UnknownMachine" // no bmc_hosts entry for the machine
	ReasonBMCUnreachable    = "BMCUnreachable" // no answer from the BMC
	ReasonBMCAuth           = "BMCAuthFailed"  // the BMC refused the credentials
	ReasonBMCError          = "BMCError"       // the BMC answered with an error
	ReasonPluginFailed      = "PluginFailed"   // the plugin crashed, hung or was refused
	ReasonInvalidParams     = "InvalidParams"
)
