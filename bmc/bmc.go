package bmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
)

// Driver operates BMCs. Every call names the BMC and carries its credentials, so a
// driver keeps no state a restart could lose. Implementations serialize calls to
// one BMC themselves: BMCs handle few sessions and dislike concurrent ones.
type Driver interface {
	// PowerStatus reads whether the machine is on.
	PowerStatus(ctx context.Context, h Host) (PowerState, error)
	// PowerOn powers the machine up; one that is on stays on.
	PowerOn(ctx context.Context, h Host) error
	// PowerOff cuts power at once, without asking the operating system.
	PowerOff(ctx context.Context, h Host) error
	// PowerCycle powers the machine off and on again; one that is off is powered on.
	PowerCycle(ctx context.Context, h Host) error
	// PowerReset resets the machine; one that is off is powered on.
	PowerReset(ctx context.Context, h Host) error
	// SetBootDevice sets the device the machine boots from next.
	SetBootDevice(ctx context.Context, h Host, d BootDevice) error
	// Inventory reads what the BMC says about itself and its machine.
	Inventory(ctx context.Context, h Host) (Inventory, error)
}

// Host is one BMC and how to log in to it.
type Host struct {
	// Name is the machine the BMC belongs to; it names the BMC in logs and errors.
	Name    string
	Address string
	// Port is the RMCP port; 0 means 623.
	Port     int
	Username string
	Password Secret
	// CipherSuite is the IPMI cipher suite (3 or 17), or 0 to let the driver choose.
	CipherSuite int
}

// DefaultPort is the RMCP port.
const DefaultPort = 623

// Addr is the BMC's host:port.
func (h Host) Addr() string {
	p := h.Port
	if p == 0 {
		p = DefaultPort
	}
	return net.JoinHostPort(h.Address, strconv.Itoa(p))
}

// String names the BMC without its credentials.
func (h Host) String() string { return h.Name + " (" + h.Addr() + ")" }

// LogValue logs the BMC without its credentials.
func (h Host) LogValue() slog.Value {
	return slog.GroupValue(slog.String("machine", h.Name), slog.String("addr", h.Addr()))
}

// Format prints the BMC as String does for every verb, so that even %+v or %#v of a
// Host (or of a struct holding one) shows no password.
func (h Host) Format(f fmt.State, verb rune) { io.WriteString(f, h.String()) }

// Secret is a credential. Its value is read only by converting it to a string;
// fmt, slog, errors, encoding/json and encoding/text print "[redacted]", so a Host
// that ends up in a log line by any route shows no password. What must carry the
// password (bmc-hosts.json, the plugin channel) uses its own plain-string types.
type Secret string

const redacted = "[redacted]"

// String returns "[redacted]".
func (Secret) String() string { return redacted }

// GoString returns "[redacted]".
func (Secret) GoString() string { return redacted }

// Format prints "[redacted]" for every verb.
func (Secret) Format(f fmt.State, verb rune) { io.WriteString(f, redacted) }

// LogValue logs "[redacted]".
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText encodes "[redacted]".
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// MarshalJSON encodes "[redacted]".
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// PowerState is what a BMC reports about its machine's power.
type PowerState string

// Power states.
const (
	PowerOn  PowerState = "on"
	PowerOff PowerState = "off"
)

// Boot devices.
const (
	DevicePXE  = "pxe"
	DeviceDisk = "disk"
)

// BootDevice is the device a machine boots from next.
type BootDevice struct {
	Device     string // DevicePXE or DeviceDisk
	EFI        bool   // boot it under UEFI rather than legacy BIOS
	Persistent bool   // for every boot from now on, not only the next one
}

// Validate checks the device name.
func (d BootDevice) Validate() error {
	if d.Device != DevicePXE && d.Device != DeviceDisk {
		return Errorf(KindInvalid, "boot device %q is not %s or %s", d.Device, DevicePXE, DeviceDisk)
	}
	return nil
}

// Inventory is what a BMC says about itself and its machine. Fields the BMC does
// not provide are empty; many BMCs have no FRU data.
type Inventory struct {
	Power            PowerState `json:"power,omitempty"`
	ManufacturerID   uint32     `json:"manufacturer_id,omitempty"`
	ProductID        uint16     `json:"product_id,omitempty"`
	FirmwareRevision string     `json:"firmware_revision,omitempty"`
	IPMIVersion      string     `json:"ipmi_version,omitempty"`
	SystemGUID       string     `json:"system_guid,omitempty"`
	BoardVendor      string     `json:"board_vendor,omitempty"`
	BoardProduct     string     `json:"board_product,omitempty"`
	BoardSerial      string     `json:"board_serial,omitempty"`
	ProductVendor    string     `json:"product_vendor,omitempty"`
	ProductName      string     `json:"product_name,omitempty"`
	ProductSerial    string     `json:"product_serial,omitempty"`
	ChassisSerial    string     `json:"chassis_serial,omitempty"`
}

// Kind says what went wrong, so the caller can tell a BMC that did not answer from
// one that refused the password, and both from a driver that died.
type Kind string

// Error kinds.
const (
	KindInvalid     Kind = "invalid"     // the request itself is wrong
	KindUnsupported Kind = "unsupported" // the driver or BMC cannot do it
	KindUnreachable Kind = "unreachable" // the BMC did not answer
	KindAuth        Kind = "auth"        // the BMC refused the credentials
	KindBMC         Kind = "bmc"         // the BMC answered with an error
	KindPlugin      Kind = "plugin"      // the driver plugin crashed, hung or was refused
	KindInternal    Kind = "internal"    // anything else
)

// Error is a driver error with its Kind. Its message never holds a credential.
type Error struct {
	Kind Kind
	Msg  string // the whole message, the cause's text included
	Err  error  // the cause, if any, for errors.Is and errors.As
}

func (e *Error) Error() string { return e.Msg }

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error of kind. A %w verb keeps its operand as the cause.
func Errorf(kind Kind, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Error{Kind: kind, Msg: err.Error(), Err: errors.Unwrap(err)}
}

// KindOf returns the kind of the first *Error in err's chain, KindInternal when
// there is none, and "" for nil.
func KindOf(err error) Kind {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}
