package ramdisk

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/protocol"
)

// DefaultDataDir holds the ramdisk's identity and journal: a tmpfs, so the identity
// dies with the boot, as the boot nonce it was bought with does.
const DefaultDataDir = "/run/bcd"

// Defaults of Agent's tunables.
const (
	DefaultFlushTimeout = 30 * time.Second
	// DefaultNetworkRetry is how long the gateway may stay unreachable before the
	// network is brought up again (a lease on the wrong NIC, a switch port that
	// came up late).
	DefaultNetworkRetry = 2 * time.Minute
	// DefaultNonceWait is how long a join refused NONCE_UNKNOWN is asked again
	// when the control plane did not mark the refusal retryable: the site agent
	// reports the nonce as it serves the iPXE script, and on a fast network (or
	// a busy site and control plane) the ramdisk's join can overtake that
	// report. Once the wait is over the refusal is final: a nonce no site agent
	// reported in two minutes will not be, and a new PXE boot mints another.
	// (serve marks NONCE_UNKNOWN retryable, and the join client asks again for
	// up to joinGiveUp; this is for a control plane or a path that does not.)
	DefaultNonceWait = 2 * time.Minute
	// joinGiveUp is the join client's own patience; the agent starts it again
	// after, since a ramdisk has nothing better to do than keep trying.
	joinGiveUp = 15 * time.Minute
)

// System is what the ramdisk needs of the machine before it can talk to anyone:
// filesystems and kernel modules (Prepare), and an address (Network). HostSystem is
// the real one; tests give one that does nothing.
type System interface {
	Prepare(ctx context.Context, log *slog.Logger) error
	Network(ctx context.Context, log *slog.Logger) error
}

// Deployer runs deploy.image and what follows it; *deploy.Deployer is the real one.
type Deployer interface {
	Deploy(ctx context.Context, r deploy.Request, progress func(deploy.Progress)) (deploy.Result, error)
	// Finish carries out the result's After (kexec, reboot, power off). It
	// returns only on failure, or at once for none.
	Finish(deploy.Result) error
}

// InstalledLoader loads the kernel of an OS already on a disk for machine.kexec.
// A Deployer that has it is used for machine.kexec; the Result's After is kexec.
type InstalledLoader interface {
	LoadInstalled(ctx context.Context, sel deploy.Target, after deploy.After) (deploy.Result, error)
}

// Agent is bcd ramdisk: it prepares the machine, joins through the discovery
// attestor as role ramdisk, and runs the commands of its session until one takes
// the machine down (kexec, reboot, power off). Params is required; every other
// field has a default.
type Agent struct {
	// Params are the kernel command line's.
	Params Params
	// Logger is the console; nil discards. Once the agent runs, what it logs from
	// Info up also goes to the control plane as events.
	Logger *slog.Logger
	// DataDir holds node.key, identity.json and journal.db; "" is DefaultDataDir.
	DataDir string
	// System prepares the machine; nil is &HostSystem{}.
	System System
	// Claims gathers the hardware claims; nil is the machine's (see Claims).
	Claims func(context.Context) protocol.Claims
	// TPM is the machine's TPM, used by the join when it opens: the node key
	// is made in it and the join carries its evidence and answers the
	// control plane's credential challenge (a machine with an enrolled EK
	// admits only the ramdisk of that TPM). nil is HostTPM() when Claims is
	// nil too (the machine's own hardware), and no TPM otherwise.
	TPM *nodekey.Host
	// Deployer runs deploy.image; nil is a *deploy.Deployer with Machine, fetching
	// through bcd.proxy.
	Deployer Deployer
	// Machine kexecs, reboots and powers off; nil is deploy.HostMachine{}.
	Machine deploy.Machine
	// Disks lists the disks disk.wipe chooses from; nil is deploy.SysBlock{}.List.
	Disks func() ([]deploy.Disk, error)
	// Wipe wipes a disk for disk.wipe; nil is WipeDisk.
	Wipe func(ctx context.Context, d deploy.Disk, mode string) (protocol.DiskWipeResult, error)
	// DCGMI is the dcgmi binary; "" looks it up on PATH, "-" means there is none.
	DCGMI string
	// BootID reads the boot id; nil is agent.BootID.
	BootID func() (string, error)
	// AllowHTTP lets deploy.image fetch http:// images (a development build); an
	// agent with a proxy allows them anyway, as the site's proxy is the only path.
	AllowHTTP bool
	// FlushTimeout bounds the wait for the gateway to acknowledge the last status
	// before the machine goes down; 0 is DefaultFlushTimeout.
	FlushTimeout time.Duration
	// NetworkRetry: see DefaultNetworkRetry.
	NetworkRetry time.Duration
	// Backoff spaces reconnects and reachability probes; JoinBackoff and
	// MaxDeferral tune the join (zero: defaults).
	Backoff, JoinBackoff agent.Backoff
	MaxDeferral          time.Duration
	// NonceWait: see DefaultNonceWait.
	NonceWait time.Duration
	// PingInterval and PingTimeout tune the session (zero: defaults).
	PingInterval, PingTimeout time.Duration

	console  *slog.Logger // the console only: the session logs here
	log      *slog.Logger // console and events
	sink     *eventSink
	session  *agent.Session
	deployer Deployer
	machine  deploy.Machine

	// busy serializes the commands that touch disks or the machine.
	busy     sync.Mutex
	busyWith atomic.Value // string: the kind holding busy
	// goingDown is set once a command has started taking the machine down.
	goingDown atomic.Bool
	// kexecLoaded records that a kernel is loaded for kexec in this boot.
	kexecLoaded atomic.Bool
	done        chan struct{}
	doneOnce    sync.Once
}

func (a *Agent) dataDir() string {
	if a.DataDir != "" {
		return a.DataDir
	}
	return DefaultDataDir
}

// Run runs the ramdisk until ctx ends (an error), a refusal ends the join (an
// error), or a command took the machine down and the machine returned (nil: only a
// fake machine returns).
func (a *Agent) Run(ctx context.Context) error {
	a.console = a.Logger
	if a.console == nil {
		a.console = slog.New(slog.DiscardHandler)
	}
	a.sink = newEventSink()
	defer a.sink.close()
	a.log = slog.New(newForwardHandler(a.console.Handler(), a.sink))
	a.done = make(chan struct{})
	a.machine = a.Machine
	if a.machine == nil {
		a.machine = deploy.HostMachine{}
	}
	a.deployer = a.Deployer
	if a.deployer == nil {
		a.deployer = &deploy.Deployer{Proxy: a.Params.Proxy, AllowHTTP: a.AllowHTTP || a.Params.Proxy != nil,
			Machine: a.machine, Log: a.log,
			NodeAgentTrust: func(chain []*x509.Certificate, serverName string) error {
				return agent.VerifyPinnedChain(chain, a.Params.Pins.ServingCA, serverName, time.Now())
			}}
	}
	sys := a.System
	if sys == nil {
		sys = &HostSystem{}
	}
	a.log.Info("bcd ramdisk starting", "version", version.Version, "params", a.Params, "data_dir", a.dataDir())

	if err := sys.Prepare(ctx, a.log); err != nil {
		a.log.Warn("preparing the machine failed; going on", "error", err.Error())
	}
	if err := a.reachGateway(ctx, sys); err != nil {
		return err
	}
	claims := a.claims(ctx)
	if d, ok := a.deployer.(*deploy.Deployer); ok && a.Deployer == nil {
		// After Prepare, which loads efivarfs and mounts it; the NICs are the
		// claims', to find their network boot entries.
		d.UEFI, d.UEFIErr = UEFIVars()
		for _, m := range claims.MACs {
			if hw, err := net.ParseMAC(m); err == nil {
				d.NICs = append(d.NICs, hw)
			}
		}
	}
	a.log.Info("hardware claims", "macs", claims.MACs, "system_uuid", claims.SystemUUID, "system_serial", claims.SystemSerial,
		"cpus", claims.CPUs, "memory_bytes", claims.MemoryBytes, "disks", len(claims.Disks), "gpus", len(claims.GPUs))

	tpmHost := a.TPM
	if tpmHost == nil && a.Claims == nil {
		tpmHost = HostTPM(a.console)
		// The node key signs through the TPM for as long as the ramdisk runs.
		defer tpmHost.Close()
	}
	id, err := a.identity(ctx, claims, tpmHost)
	if err != nil {
		return err
	}
	j, err := journal.Open(filepath.Join(a.dataDir(), journal.FileName), id.NodeID, journal.Options{Logger: a.console})
	if err != nil {
		return fmt.Errorf("bcd ramdisk: %w", err)
	}
	defer j.Close()
	bootID := a.BootID
	if bootID == nil {
		bootID = agent.BootID
	}
	bid, err := bootID()
	if err != nil {
		a.log.Warn("no boot id", "error", err.Error())
	}
	a.session = &agent.Session{
		GatewayURL:   a.Params.GatewayURL,
		ServerName:   a.Params.ServerName,
		ServingCAPin: a.Params.Pins.ServingCA,
		Proxy:        a.Params.Proxy,
		Identity:     id,
		Journal:      j,
		Handlers:     a.handlers(),
		OnSpec: func(ctx context.Context, s protocol.Spec) {
			a.console.Debug("desired state received; the ramdisk applies no section", "revision", s.Revision)
			a.session.ReportDaemonUnsupported(s)
		},
		Claims:       &claims,
		BootID:       bid,
		Backoff:      a.Backoff,
		PingInterval: a.PingInterval,
		PingTimeout:  a.PingTimeout,
		Logger:       a.console,
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		a.sink.drain(sctx, a.session.Event, a.console)
	}()
	sessErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		sessErr <- a.session.Run(sctx)
	}()
	a.log.Info("running the ramdisk's session", "node_id", id.NodeID, "gateway", a.Params.GatewayURL)
	var runErr error
	select {
	case <-ctx.Done():
		runErr = ctx.Err()
	case err := <-sessErr:
		runErr = fmt.Errorf("bcd ramdisk: %w", err)
	case <-a.done:
		a.console.Info("the machine was handed over; bcd ramdisk stops")
	}
	stop()
	wg.Wait()
	return runErr
}

// reachGateway brings the network up and waits until the gateway answers a TLS
// handshake under the serving CA pin, through bcd.proxy when it is set. It brings
// the network up again when that takes longer than NetworkRetry. A gateway whose
// certificate fails the pin is an error: no retry will change it.
func (a *Agent) reachGateway(ctx context.Context, sys System) error {
	retry := a.NetworkRetry
	if retry <= 0 {
		retry = DefaultNetworkRetry
	}
	via := "direct"
	if a.Params.Proxy != nil {
		via = a.Params.Proxy.Host
	}
	for attempt := 0; ; attempt++ {
		if err := sys.Network(ctx, a.log); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d := a.Backoff.Delay(attempt)
			a.log.Warn("no network yet; trying again", "error", err.Error(), "retry_in", d.Round(time.Millisecond).String())
			if !agent.Sleep(ctx, d) {
				return ctx.Err()
			}
			continue
		}
		since := time.Now()
		for probe := 0; ; probe++ {
			err := a.probe(ctx)
			if err == nil {
				a.log.Info("the gateway answers", "gateway", a.Params.GatewayURL, "proxy", via)
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var te *agent.TrustError
			if errors.As(err, &te) {
				return fmt.Errorf("bcd ramdisk: %w", err)
			}
			wait := a.Backoff.Delay(probe)
			a.log.Warn("the gateway does not answer yet", "gateway", a.Params.GatewayURL, "proxy", via,
				"error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
			if time.Since(since) > retry {
				break
			}
			if !agent.Sleep(ctx, wait) {
				return ctx.Err()
			}
		}
	}
}

// probe opens a connection to the gateway as the join will (through the proxy,
// TLS pinned to the serving CA) and closes it.
func (a *Agent) probe(ctx context.Context) error {
	u, err := url.Parse(a.Params.GatewayURL)
	if err != nil {
		return fmt.Errorf("gateway url: %w", err)
	}
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dial := agent.ProxyDialer(a.Params.Proxy, &net.Dialer{Timeout: 5 * time.Second})
	conn, err := dial(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return err
	}
	defer conn.Close()
	if u.Scheme != "https" {
		return nil
	}
	cfg, err := agent.PinnedTLSConfig(a.Params.Pins.ServingCA, a.Params.ServerName)
	if err != nil {
		return &agent.TrustError{Err: err}
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return err
	}
	return tc.Close()
}

// AskWitness asks the site agent at bcd.witness to countersign the join for
// the CSR csrSHA256: the control plane takes a discovery join only with the
// minting site's witness. The site answers only the machine whose MAC its
// neighbour table has for this address, so this goes straight to it, never
// through the proxy. A site that renders no bcd.witness gets no ask, and the
// join is refused (NONCE_NOT_WITNESSED) with a message that says so.
func (a *Agent) AskWitness(ctx context.Context, csrSHA256 string) (*protocol.BootWitness, error) {
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.Params.Witness == nil {
		a.log.Warn("no " + protocol.CmdlineWitness + " on the kernel command line: the site agent is of an older release; the join goes without the site's witness and the control plane refuses it")
		return nil, nil
	}
	body, _ := json.Marshal(protocol.WitnessRequest{BootNonce: a.Params.BootNonce, CSRSHA256: csrSHA256})
	var last error
	for attempt := 0; attempt < witnessTries; attempt++ {
		if attempt > 0 && !agent.Sleep(ctx, a.JoinBackoff.Delay(attempt-1)) {
			return nil, ctx.Err()
		}
		w, retry, err := a.postWitness(ctx, body)
		if err == nil {
			return w, nil
		}
		if !retry {
			return nil, err
		}
		last = err
		a.log.Warn("the site agent's witness did not answer; asking again", "url", a.Params.Witness.String(), "error", err.Error())
	}
	return nil, fmt.Errorf("the site agent's witness at %s: %w", a.Params.Witness, last)
}

// witnessTries bounds the asks of one key's witness.
const witnessTries = 5

func (a *Agent) postWitness(ctx context.Context, body []byte) (_ *protocol.BootWitness, retry bool, _ error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.Params.Witness.String(), bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	// No proxy, whatever the environment says: the site must see this machine.
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return nil, true, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if err != nil {
		return nil, true, err
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		var w protocol.BootWitness
		if err := json.Unmarshal(b, &w); err != nil {
			return nil, false, fmt.Errorf("the site agent's witness answer is not JSON: %w", err)
		}
		return &w, false, nil
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return nil, true, fmt.Errorf("the site agent's witness answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil, false, fmt.Errorf("the site agent refused to witness this machine's join (%s): %s", resp.Status, strings.TrimSpace(string(b)))
}

// identity loads the identity a join of this boot left in the data directory (a
// restarted bcd ramdisk must not spend the nonce twice), or joins.
func (a *Agent) identity(ctx context.Context, claims protocol.Claims, host *nodekey.Host) (*agent.Identity, error) {
	var keys agent.KeyStore
	var prover join.TPMProver
	if host != nil {
		switch _, err := host.TPM(); {
		case err == nil:
			keys, prover = host, host
		case !errors.Is(err, nodekey.ErrNoTPM):
			a.log.Warn("the TPM does not open; joining without it (a machine whose TPM is enrolled refuses such a ramdisk)", "tpm", host.Where(), "error", err.Error())
		}
	}
	id, err := agent.LoadIdentity(a.dataDir(), keys)
	switch {
	case err == nil && id.Role == protocol.RoleRamdisk:
		a.log.Info("already joined in this boot", "node_id", id.NodeID)
		return id, nil
	case err == nil:
		return nil, fmt.Errorf("bcd ramdisk: %s holds the identity of %s %s, not a ramdisk", a.dataDir(), id.Role, id.NodeID)
	case !errors.Is(err, agent.ErrNotJoined):
		return nil, fmt.Errorf("bcd ramdisk: the identity in %s does not load: %w", a.dataDir(), err)
	}
	client := &join.Client{
		GatewayURL:  a.Params.GatewayURL,
		ServerName:  a.Params.ServerName,
		Pins:        a.Params.Pins,
		Backoff:     a.JoinBackoff,
		GiveUpAfter: joinGiveUp,
		MaxDeferral: a.MaxDeferral,
		Logger:      a.console,
		Proxy:       a.Params.Proxy,
		Witness:     a.AskWitness,
		Keys:        keys,
		TPM:         prover,
		OnDeferral: func(wait time.Duration, n int) {
			a.log.Warn("WAITING FOR APPROVAL: the control plane holds this machine's join until an operator approves it",
				"macs", claims.MACs, "system_serial", claims.SystemSerial, "site", a.Params.Site,
				"asking_again_in", wait.String(), "deferrals", n)
		},
	}
	req := join.Request{
		Role:      protocol.RoleRamdisk,
		Attestor:  protocol.AttestorDiscovery,
		BootNonce: a.Params.BootNonce,
		Site:      a.Params.Site,
		Claims:    claims,
	}
	nonceWait := a.NonceWait
	if nonceWait <= 0 {
		nonceWait = DefaultNonceWait
	}
	var nonceUnknownSince time.Time
	nonceUnknown := 0
	tpmWhere := "none"
	if prover != nil {
		tpmWhere = host.Where()
	}
	a.log.Info("joining through the discovery attestor", "gateway", a.Params.GatewayURL, "macs", claims.MACs, "tpm", tpmWhere)
	for {
		var key *agent.NodeKey
		id, key, err = client.Join(ctx, req)
		var refused *join.RefusedError
		switch {
		case err == nil:
			if err := agent.SaveIdentity(a.dataDir(), id, key); err != nil {
				return nil, fmt.Errorf("bcd ramdisk: joined as %s but could not store the identity: %w", id.NodeID, err)
			}
			a.log.Info("joined", "node_id", id.NodeID, "role", id.Role, "site", id.Site)
			return id, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.As(err, &refused) && refused.Response.Code == protocol.CodeNonceUnknown &&
			(nonceUnknownSince.IsZero() || time.Since(nonceUnknownSince) < nonceWait):
			// The race of a fast boot: the join got to the control plane before
			// the site agent's boot.nonce event did. Not final yet.
			if nonceUnknownSince.IsZero() {
				nonceUnknownSince = time.Now()
			}
			d := a.JoinBackoff.Delay(nonceUnknown)
			nonceUnknown++
			a.log.Warn("the control plane does not know this boot's nonce yet: the site agent's report of it may still be on its way; asking again",
				"code", refused.Response.Code, "retry_in", d.Round(time.Millisecond).String(),
				"waiting", time.Since(nonceUnknownSince).Round(time.Second).String(), "gives_up_after", nonceWait.String())
			if !agent.Sleep(ctx, d) {
				return nil, ctx.Err()
			}
			continue
		case errors.As(err, &refused):
			if refused.Response.Code == protocol.CodeNonceUnknown {
				err = fmt.Errorf("%w (still unknown after %s)", err, time.Since(nonceUnknownSince).Round(time.Second))
			}
			a.log.Error("the control plane refused this machine's join; it needs a new PXE boot (a fresh boot nonce) or an operator",
				"code", refused.Response.Code, "message", refused.Response.Message)
			return nil, fmt.Errorf("bcd ramdisk: %w", err)
		}
		var te *agent.TrustError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("bcd ramdisk: %w", err)
		}
		a.log.Warn("the join did not get through; starting again", "error", err.Error())
		if !agent.Sleep(ctx, a.Backoff.Delay(3)) {
			return nil, ctx.Err()
		}
	}
}

// claims are the hardware claims: agent.ClaimsSource's, with the disks as deploy
// sees them (serials from SCSI VPD pages too).
func (a *Agent) claims(ctx context.Context) protocol.Claims {
	if a.Claims != nil {
		return a.Claims(ctx)
	}
	return Claims(ctx)
}

// tpmEK is the machine's EK claim, read once: deriving the EK is a
// TPM2_CreatePrimary, which a real TPM takes seconds over, and the join and
// every inventory would otherwise each do it.
var tpmEK = sync.OnceValue(func() string {
	host := HostTPM(nil)
	defer host.Close()
	ek, _ := host.EKClaim() // no TPM, or one that does not answer: no claim
	return ek
})

// HostTPM is the machine's TPM: the kernel's resource manager /dev/tpmrm0,
// else /dev/tpm0 when the kernel made only that (TPM() says ErrNoTPM when
// there is neither). A fakehw build uses swtpm at BCD_FAKEHW_TPM_TCP when set.
func HostTPM(log *slog.Logger) *nodekey.Host {
	h := &nodekey.Host{Logger: log}
	if _, err := os.Stat(tpm.DefaultPath); err != nil {
		if _, err := os.Stat(rawTPMPath); err == nil {
			h.Path = rawTPMPath
		}
	}
	return h
}

// rawTPMPath is the TPM's character device without the resource manager.
const rawTPMPath = "/dev/tpm0"

// Claims reads this machine's claims, with its TPM's endorsement key where
// it has one: discovery can then tie the ramdisk and the installed OS (whose
// joins carry the same EK) to the same hardware, and an operator enrolls the
// EK from the machine's inventory (better-compute machines enroll-tpm).
func Claims(ctx context.Context) protocol.Claims {
	c := agent.ClaimsSource{}.Collect(ctx)
	c.TPMEK = tpmEK()
	if disks, err := (deploy.SysBlock{}).List(); err == nil {
		c.Disks = c.Disks[:0]
		for _, d := range disks {
			c.Disks = append(c.Disks, protocol.Disk{Name: d.Name, SizeBytes: d.Size, Model: d.Model, Serial: d.Serial,
				Removable: d.Removable, Rotational: d.Rotational})
		}
	}
	return c
}

func (a *Agent) finish() { a.doneOnce.Do(func() { close(a.done) }) }

// The real deployer loads installed kernels, so machine.kexec works with it.
var _ InstalledLoader = (*deploy.Deployer)(nil)
