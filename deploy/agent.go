package deploy

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/agent/units"
	"github.com/better-compute/bcd/protocol"
)

// Where a deploy with a node agent installs it into a stock root, as the
// install script does: the binary, the hardened unit (the script's exact
// bytes), the join unit, and the enable symlinks systemctl enable would make.
const (
	NodeAgentBinaryPath = "/usr/local/bin/bcd"
	NodeAgentUnitPath   = "/etc/systemd/system/bcd.service"
	NodeAgentJoinPath   = "/etc/systemd/system/bcd-join.service"
	unitWantsDir        = "/etc/systemd/system/multi-user.target.wants"
	// NodeAgentBootOrderPath keeps network boot first on a UEFI machine.
	NodeAgentBootOrderPath = "/etc/systemd/system/bcd-boot-order.service"
	// ProxyDropIn is the drop-in, for bcd.service and bcd-join.service, that
	// names the proxy the deploy fetched through: a machine that reached the
	// image only through the site's proxy reaches the control plane the same
	// way. Named 10-… so an operator's own drop-in (50-proxy.conf) overrides it.
	ProxyDropIn = "10-bcd-proxy.conf"
)

// BootOrderUnit runs bcd boot-order keep at boot and, as its stop, at shutdown:
// whatever put itself first in the UEFI boot order while the OS ran
// (grub-install, an OS update, efibootmgr) is moved behind the network entry
// the deploy put first, before the machine boots again. It does nothing on BIOS
// or where no deploy recorded an entry.
const BootOrderUnit = `[Unit]
Description=better-compute: keep network boot first in the UEFI boot order
ConditionPathExists=/sys/firmware/efi
ConditionPathExists=/etc/bcd/efi-boot-first
After=local-fs.target sys-firmware-efi-efivars.mount
DefaultDependencies=no
Before=shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/bcd boot-order keep
ExecStop=/usr/local/bin/bcd boot-order keep
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
`

// proxyDropIn is ProxyDropIn's content for a proxy URL. Go's HTTP client (bcd)
// reads HTTPS_PROXY; the lowercase one is for anything else the unit runs.
func proxyDropIn(proxy string) string {
	return "# Written by the deploy: the proxy the ramdisk fetched the image through.\n[Service]\n" +
		"Environment=HTTPS_PROXY=" + proxy + " https_proxy=" + proxy + "\n"
}

// JoinUnit runs the provisioned join once, before bcd.service: the join
// deletes /etc/bcd/join-token, so the unit is skipped on every later boot.
const JoinUnit = `[Unit]
Description=better-compute: join this installed OS with the token its deploy wrote
ConditionPathExists=/etc/bcd/join-token
ConditionPathExists=/etc/bcd/node-id
After=network-online.target
Wants=network-online.target
Before=bcd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'exec /usr/local/bin/bcd join --token-file /etc/bcd/join-token --node-id "$(cat /etc/bcd/node-id)"'
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
`

// fetchNodeAgent downloads the node agent through the image's proxy into the
// deploy's private temp dir and checks its SHA-256 (and size, when given).
// It returns the file's path.
func (d *Deployer) fetchNodeAgent(ctx context.Context, p *Request, tmp string) (string, error) {
	a := p.NodeAgent
	what := fmt.Sprintf("node agent bcd %s from %s", a.Version, protocol.RedactURL(a.URL))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
	if err != nil {
		return "", failf(reasonInvalid, "%s: %v", what, stripURLError(err))
	}
	req.Header.Set("Accept-Encoding", "identity")
	client := &http.Client{Transport: d.nodeAgentTransport(p), CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("more than 5 redirects")
		}
		if r.URL.Scheme != "https" && !d.AllowHTTP {
			return errors.New("redirected to a URL that is not https")
		}
		return nil
	}}
	if u := req.URL; u.Scheme != "https" && !d.AllowHTTP {
		return "", failf(reasonInvalid, "%s: not an https URL", what)
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", &Error{Reason: reasonCancelled, Err: fmt.Errorf("deploy: %s: %w", what, ctx.Err())}
		}
		return "", failf(reasonDownload, "%s: %v", what, stripURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", failf(reasonDownload, "%s: HTTP %s", what, resp.Status)
	}
	dst := filepath.Join(tmp, "node-agent")
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", failf(reasonFiles, "%s: %v", what, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(resp.Body, protocol.MaxNodeAgentSize+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", failf(reasonDownload, "%s: %v", what, stripURLError(err))
	}
	if n > protocol.MaxNodeAgentSize || a.Size > 0 && n != a.Size {
		return "", failf(reasonSize, "%s: %d bytes, expected %d", what, n, a.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		return "", failf(reasonDigest, "%s: SHA-256 %s, expected %s (the release's); nothing was installed", what, got, a.SHA256)
	}
	return dst, nil
}

// nodeAgentFiles are the files and links that install the downloaded agent;
// with a proxy, the units' proxy drop-ins.
func nodeAgentFiles(binary, proxy string) ([]File, []extWrite, error) {
	content, err := os.ReadFile(binary)
	if err != nil {
		return nil, nil, failf(reasonFiles, "node agent: %v", err)
	}
	files := []File{
		{FS: protocol.FSRoot, Path: NodeAgentBinaryPath, Mode: 0o755, Content: content},
		{FS: protocol.FSRoot, Path: NodeAgentUnitPath, Mode: 0o644, Content: Content(units.BCDUnit)},
		{FS: protocol.FSRoot, Path: NodeAgentJoinPath, Mode: 0o644, Content: Content(JoinUnit)},
	}
	links := []extWrite{
		{dest: unitWantsDir + "/bcd.service", link: NodeAgentUnitPath},
		{dest: unitWantsDir + "/bcd-join.service", link: NodeAgentJoinPath},
		{dest: unitWantsDir + "/bcd-boot-order.service", link: NodeAgentBootOrderPath},
	}
	files = append(files, File{FS: protocol.FSRoot, Path: NodeAgentBootOrderPath, Mode: 0o644, Content: Content(BootOrderUnit)})
	if proxy != "" {
		for _, unit := range []string{NodeAgentUnitPath, NodeAgentJoinPath} {
			files = append(files, File{FS: protocol.FSRoot, Path: unit + ".d/" + ProxyDropIn, Mode: 0o644, Content: Content(proxyDropIn(proxy))})
		}
	}
	return files, links, nil
}

// CloudInitPath is where a deploy looks for cloud-init in the root.
const CloudInitPath = "/usr/bin/cloud-init"

// checkCloudInit returns a warning when the deploy wrote a NoCloud seed into a
// root without cloud-init, "" otherwise.
func (d *Deployer) checkCloudInit(ctx context.Context, in *installed, files []File, tmp string) string {
	seed := false
	for _, f := range files {
		if f.FS != protocol.FSESP && strings.HasPrefix(f.Path, protocol.NoCloudSeedDir+"/") {
			seed = true
		}
	}
	if !seed || in.root == nil {
		return ""
	}
	ok, err := in.root.exists(ctx, tmp, CloudInitPath)
	switch {
	case err != nil:
		return fmt.Sprintf("cloud-init was not found in the image: looking for %s: %v", CloudInitPath, err)
	case !ok:
		return fmt.Sprintf("cloud-init was not found in the image: no %s; the NoCloud seed in %s was written but nothing will read it (hostname and SSH keys are not applied)",
			CloudInitPath, protocol.NoCloudSeedDir)
	}
	return ""
}

// nodeAgentTransport is the image's transport, but a server certificate is
// also good when NodeAgentTrust takes it: the release's binaries are served by
// the control plane (its /downloads), under the serving CA the ramdisk pins,
// which is in no system root store. The SHA-256 check stays what makes the
// binary the release's.
func (d *Deployer) nodeAgentTransport(p *Request) http.RoundTripper {
	rt := d.transport(p)
	tr, ok := rt.(*http.Transport)
	if !ok || d.NodeAgentTrust == nil || d.Transport != nil {
		return rt
	}
	tr = tr.Clone()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if tr.TLSClientConfig != nil {
		cfg = tr.TLSClientConfig.Clone()
	}
	roots := cfg.RootCAs
	// An IP address is sent as no SNI: the name to verify is then the URL's.
	host := ""
	if u, err := url.Parse(p.NodeAgent.URL); err == nil {
		host = u.Hostname()
	}
	cfg.InsecureSkipVerify = true // replaced by VerifyConnection, which runs on every handshake
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the server sent no certificate")
		}
		name := cs.ServerName
		if name == "" {
			name = host
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: name, Intermediates: inter})
		if err == nil {
			return nil
		}
		if perr := d.NodeAgentTrust(cs.PeerCertificates, name); perr != nil {
			return fmt.Errorf("%v; and not under the pinned serving CA: %v", err, perr)
		}
		return nil
	}
	tr.TLSClientConfig = cfg
	return tr
}
