package ipxe

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/better-compute/bcd/protocol"
)

// MaxCommandLine is the longest kernel command line Render accepts: the x86 and arm64
// kernels keep 2048 bytes and cut the rest silently.
const MaxCommandLine = 2048

// Params are the bcd.* parameters on every ramdisk command line of a site: where the
// control plane is and the pins that make it trustworthy. They are the same for every
// machine; only the boot nonce changes per render.
type Params struct {
	GatewayURL        string // bcd.gateway_url: https://… (http:// only for development builds)
	ServerName        string // bcd.server_name: the gateway's TLS server name
	Site              string // bcd.site
	ServingCAPin      string // bcd.serving_ca_pin: sha256/<base64>
	JoinSigningPin    string // bcd.join_signing_pin: sha256/<base64>
	JoinEncryptionPin string // bcd.join_encryption_pin: sha256/<base64>
	Proxy             string // bcd.proxy: optional HTTP proxy URL for the ramdisk
	Witness           string // bcd.witness: the site agent's witness URL (protocol.WitnessPath)
	Log               string // bcd.log: optional log level
}

// Validate checks every parameter, naming the first one that is wrong.
func (p Params) Validate() error {
	_, err := p.args("")
	return err
}

// args returns the bcd.* kernel arguments with nonce, in a fixed order. An empty
// nonce is left out (Validate has none to check).
func (p Params) args(nonce string) ([]string, error) {
	type param struct {
		name, value string
		check       func(name, v string) error
	}
	params := []param{
		{protocol.CmdlineGatewayURL, p.GatewayURL, checkURL},
		{protocol.CmdlineServerName, p.ServerName, checkWord},
		{protocol.CmdlineSite, p.Site, checkWord},
		{protocol.CmdlineServingCAPin, p.ServingCAPin, checkPin},
		{protocol.CmdlineJoinSigningPin, p.JoinSigningPin, checkPin},
		{protocol.CmdlineJoinEncryptionPin, p.JoinEncryptionPin, checkPin},
	}
	if nonce != "" {
		params = append(params, param{protocol.CmdlineBootNonce, nonce, checkWord})
	}
	if p.Proxy != "" {
		params = append(params, param{protocol.CmdlineProxy, p.Proxy, checkURL})
	}
	if p.Witness != "" {
		params = append(params, param{protocol.CmdlineWitness, p.Witness, checkURL})
	}
	if p.Log != "" {
		params = append(params, param{protocol.CmdlineLog, p.Log, checkWord})
	}
	out := make([]string, 0, len(params))
	for _, a := range params {
		if err := a.check(a.name, a.value); err != nil {
			return nil, err
		}
		out = append(out, a.name+"="+a.value)
	}
	return out, nil
}

// ErrInvalid is wrapped by every error about a value that cannot go into a script.
var ErrInvalid = errors.New("invalid script value")

// checkWord accepts one printable ASCII word that survives both the iPXE command
// line (no ${…} expansion, no || or && token, no comment) and the kernel command line
// (no spaces or quotes). Errors name the field, never the value: some are credentials.
func checkWord(name, v string) error {
	if v == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, name)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c <= ' ' || c >= 0x7f:
			return fmt.Errorf("%w: %s contains a space, a control character or non-ASCII", ErrInvalid, name)
		case c == '"' || c == '\'' || c == '`' || c == '\\':
			return fmt.Errorf("%w: %s contains a quote or a backslash", ErrInvalid, name)
		case c == '$' || c == '#':
			return fmt.Errorf("%w: %s contains '$' or '#', which iPXE would interpret", ErrInvalid, name)
		}
	}
	if v == "||" || v == "&&" {
		return fmt.Errorf("%w: %s is an iPXE operator", ErrInvalid, name)
	}
	return nil
}

// checkURL accepts an absolute http or https URL that is also a word.
func checkURL(name, v string) error {
	if err := checkWord(name, v); err != nil {
		return err
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: %s is not an http:// or https:// URL", ErrInvalid, name)
	}
	return nil
}

// checkPin accepts sha256/ and the standard base64 of 32 bytes.
func checkPin(name, v string) error {
	if err := checkWord(name, v); err != nil {
		return err
	}
	b64, ok := strings.CutPrefix(v, "sha256/")
	if b, err := base64.StdEncoding.DecodeString(b64); !ok || err != nil || len(b) != 32 {
		return fmt.Errorf("%w: %s is not a pin (sha256/ and the base64 of 32 bytes)", ErrInvalid, name)
	}
	return nil
}

// checkCmdline accepts words separated by ASCII spaces.
func checkCmdline(name, v string) ([]string, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] >= 0x7f {
			return nil, fmt.Errorf("%w: %s contains a control character or non-ASCII", ErrInvalid, name)
		}
	}
	words := strings.Fields(v)
	for _, w := range words {
		if err := checkWord(name, w); err != nil {
			return nil, err
		}
		// Two values for one parameter would leave the ramdisk to guess which is meant.
		if strings.HasPrefix(w, "bcd.") {
			return nil, fmt.Errorf("%w: %s sets a bcd.* parameter, which the site agent renders itself", ErrInvalid, name)
		}
	}
	return words, nil
}
