package ipxe

import (
	"bytes"
	"embed"
	"fmt"
	"io"
	"strings"
	"text/template"

	"github.com/better-compute/bcd/protocol"
)

//go:embed ramdisk.ipxe local.ipxe unknown.ipxe
var files embed.FS

var templates = template.Must(template.New("").Option("missingkey=error").ParseFS(files, "*.ipxe"))

// How long a script waits before fetching itself again, in seconds, when its Retry
// is zero: after a failed ramdisk download, and for a MAC without a boot entry (whose
// entry may take an operator to appear).
const (
	DefaultRetry        = 10
	DefaultUnknownRetry = 30
)

// Ramdisk renders the script that boots the bcd ramdisk (ramdisk.ipxe).
type Ramdisk struct {
	MAC       string // the machine, aa:bb:cc:dd:ee:ff
	Kernel    string // kernel URL
	Initrd    string // initramfs URL
	Cmdline   string // the operator's kernel arguments, space-separated (console=… and the like)
	Params    Params // the site's bcd.* parameters
	Nonce     string // bcd.boot_nonce, minted for this render
	ScriptURL string // this script's own URL, fetched again after a failure
	Retry     int    // seconds to wait before that; 0 means DefaultRetry
}

// CommandLine is the kernel command line: initrd=initrd (the EFI stub loads the initrd
// by that name), the operator's arguments, then the bcd.* parameters.
func (r Ramdisk) CommandLine() (string, error) {
	words, err := checkCmdline("cmdline", r.Cmdline)
	if err != nil {
		return "", err
	}
	if r.Nonce == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrInvalid, "boot nonce")
	}
	bcd, err := r.Params.args(r.Nonce)
	if err != nil {
		return "", err
	}
	line := strings.Join(append(append([]string{"initrd=initrd"}, words...), bcd...), " ")
	if len(line) > MaxCommandLine {
		return "", fmt.Errorf("%w: the kernel command line is %d bytes, more than %d", ErrInvalid, len(line), MaxCommandLine)
	}
	return line, nil
}

// Render writes the script, or nothing and an error wrapping ErrInvalid naming the
// first field that cannot go into it.
func (r Ramdisk) Render(w io.Writer) error {
	if r.Retry == 0 {
		r.Retry = DefaultRetry
	}
	if err := check(r.MAC, r.ScriptURL, r.Retry); err != nil {
		return err
	}
	if err := checkURL("kernel", r.Kernel); err != nil {
		return err
	}
	if err := checkURL("initrd", r.Initrd); err != nil {
		return err
	}
	if _, err := r.CommandLine(); err != nil {
		return err
	}
	return execute(w, "ramdisk.ipxe", r)
}

// Local renders the script that boots the machine's installed disk (local.ipxe).
type Local struct {
	MAC string // the machine, aa:bb:cc:dd:ee:ff
}

// Render writes the script.
func (l Local) Render(w io.Writer) error {
	if err := checkMAC(l.MAC); err != nil {
		return err
	}
	return execute(w, "local.ipxe", l)
}

// Unknown renders the script for a MAC without a boot entry (unknown.ipxe): it waits
// and fetches itself again.
type Unknown struct {
	MAC       string // the machine, aa:bb:cc:dd:ee:ff
	ScriptURL string // this script's own URL
	Retry     int    // seconds between attempts; 0 means DefaultUnknownRetry
}

// Render writes the script.
func (u Unknown) Render(w io.Writer) error {
	if u.Retry == 0 {
		u.Retry = DefaultUnknownRetry
	}
	if err := check(u.MAC, u.ScriptURL, u.Retry); err != nil {
		return err
	}
	return execute(w, "unknown.ipxe", u)
}

func check(mac, scriptURL string, retry int) error {
	if err := checkMAC(mac); err != nil {
		return err
	}
	if retry < 0 || retry > 3600 {
		return fmt.Errorf("%w: retry is %d s, not between 1 and 3600", ErrInvalid, retry)
	}
	return checkURL("script URL", scriptURL)
}

func checkMAC(mac string) error {
	hw, err := protocol.ParseMAC(mac)
	if err != nil || len(hw) != 6 || hw.String() != mac {
		return fmt.Errorf("%w: MAC is not of the form aa:bb:cc:dd:ee:ff", ErrInvalid)
	}
	return nil
}

// execute renders into a buffer first so that a failure writes nothing.
func execute(w io.Writer, name string, data any) error {
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		return fmt.Errorf("rendering %s: %w", name, err)
	}
	_, err := w.Write(b.Bytes())
	return err
}
