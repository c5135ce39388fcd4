package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/ramdisk"
)

// Stages of a machine's boot, in order, as Result reports them.
const (
	StageDHCP      = "dhcp"      // both DHCP rounds (PXE ROM, then iPXE), 4011 included
	StageTFTP      = "tftp"      // the boot file the offer named
	StageScript    = "script"    // the iPXE script over HTTP
	StageKernel    = "kernel"    // the ramdisk's kernel
	StageInitrd    = "initrd"    // and its initrd
	StageJoin      = "join"      // the ramdisk's discovery join, until it holds a certificate
	StageInventory = "inventory" // joined → the inventory command answered
	StageDeploy    = "deploy"    // deploy.image: the image streamed, verified, files written
	StageNodeJoin  = "node_join" // the "kexec" → the installed OS joined (attestor provisioned)
	StageSession   = "session"   // → the node session's first Welcome
)

// Stages lists the stages in the order a machine passes them.
var Stages = []string{StageDHCP, StageTFTP, StageScript, StageKernel, StageInitrd, StageJoin,
	StageInventory, StageDeploy, StageNodeJoin, StageSession}

// machine is one simulated machine: its chassis and BMC, its firmware, its
// ramdisk and its installed OS, each run anew when the BMC powers it on or resets it.
type machine struct {
	f        *fleet
	index    int
	name     string
	mac      net.HardwareAddr
	ip       netip.Addr
	fw       string
	uuid     [16]byte
	password string
	dir      string
	chassis  *chassis
	bmc      *simBMC

	mu        sync.Mutex
	cancel    context.CancelFunc
	running   chan struct{} // closed when the current boot's goroutine ends
	boots     int
	stages    map[string]time.Duration // of the current boot
	lastErr   string                   // why the last boot stopped, if it failed
	installed bool
	welcomed  bool
	retrans   int
	// rec is the running ramdisk's log, for where the machine is.
	rec *recorder
}

// where says how far the machine's current boot got: the first stage it has not
// finished, its boot count, and what its ramdisk last warned of, for a run's
// progress and for the machines a run leaves stuck.
func (m *machine) where() (stage, detail string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.boots == 0:
		return "off", "never powered on"
	case m.welcomed:
		return "up", ""
	}
	stage = "up"
	for _, st := range Stages {
		if _, ok := m.stages[st]; !ok {
			stage = st
			break
		}
	}
	detail = fmt.Sprintf("boot %d", m.boots)
	if m.lastErr != "" {
		detail += "; last error: " + m.lastErr
	}
	if m.rec != nil {
		if n := m.rec.lastNote(); n != "" {
			detail += "; the ramdisk last said: " + n
		}
	}
	return stage, detail
}

func (m *machine) setStage(name string, d time.Duration) {
	m.mu.Lock()
	m.stages[name] = d
	m.mu.Unlock()
}

func (m *machine) fail(err error) {
	m.mu.Lock()
	m.lastErr = err.Error()
	m.mu.Unlock()
	m.f.logf("machine %s: %v", m.name, err)
}

// power is the chassis's call: start, restart or stop the machine.
func (m *machine) power(p power) {
	m.mu.Lock()
	if m.cancel != nil {
		m.cancel()
	}
	prev := m.running
	m.cancel, m.running = nil, nil
	if p == powerOff {
		m.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(m.f.ctx)
	done := make(chan struct{})
	m.cancel, m.running = cancel, done
	m.boots++
	m.stages = map[string]time.Duration{}
	m.lastErr = ""
	m.welcomed = false
	m.rec = nil
	installed := m.installed
	m.mu.Unlock()
	go func() {
		defer close(done)
		if prev != nil {
			<-prev // one boot at a time: the old one lets go of its files first
		}
		pxe := m.chassis.bootPXE(installed)
		if err := m.boot(ctx, pxe); err != nil && ctx.Err() == nil {
			m.fail(err)
		}
	}()
}

func (m *machine) boot(ctx context.Context, pxe bool) error {
	if !pxe {
		return m.installedOS(ctx)
	}
	// Firmware set to retry its boot sequence (a common BIOS setting) starts the
	// network boot again after a failed one, a few times, before it gives up.
	var p *ramdisk.Params
	var err error
	for try := 0; ; try++ {
		if p, err = m.firmware(ctx); err == nil || ctx.Err() != nil || try == bootRetries {
			break
		}
		m.fail(fmt.Errorf("network boot %d of %d: %w", try+1, bootRetries+1, err))
		if !agent.Sleep(ctx, bootRetryDelay) {
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	if p == nil { // the script said: boot from the local disk
		return m.installedOS(ctx)
	}
	handed, err := m.ramdisk(ctx, *p)
	if err != nil || !handed {
		return err
	}
	return m.installedOS(ctx)
}

// bootRetries and bootRetryDelay are the firmware's boot sequence retry.
const (
	bootRetries    = 5
	bootRetryDelay = 5 * time.Second
)

// maxScriptRetries bounds how often the machine fetches a script that says "no
// boot entry yet, retrying" (iPXE would loop for ever; the lifecycle resets it).
const maxScriptRetries = 60

var kernelLine = "kernel "

// firmware is PXE ROM then iPXE, run in the firmware child (firmware.go): it
// returns the ramdisk's parameters from the kernel command line of the iPXE
// script, or nil when the script boots the disk.
func (m *machine) firmware(ctx context.Context) (*ramdisk.Params, error) {
	a, err := m.f.fw.boot(ctx, m.index)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.retrans += a.Retransmits
	for st, d := range a.Stages {
		m.stages[st] = d
	}
	m.mu.Unlock()
	switch {
	case a.Err != "":
		return nil, errors.New(a.Err)
	case a.Local:
		return nil, nil
	}
	p, err := ramdisk.ParseParams(a.Args, false)
	if err != nil {
		return nil, fmt.Errorf("the iPXE script's kernel command line: %w", err)
	}
	// The kernel and the initramfs boot before bcd ramdisk starts: seconds on real
	// hardware, during which the site's report of the nonce reaches the control plane.
	if d := m.f.cfg.KernelBoot; d > 0 {
		jitter := time.Duration(mrand.Int64N(int64(d)/2 + 1))
		if !agent.Sleep(ctx, d-d/4+jitter) {
			return nil, ctx.Err()
		}
	}
	return &p, nil
}

// parseScript reads the kernel line (URL and command line), the initrd URL and the
// retry delay of one of the site's iPXE scripts (ipxe/*.ipxe).
func parseScript(s string) (kernel, args, initrd string, retry int) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, " || "); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "kernel":
			if len(f) > 1 {
				kernel = f[1]
				args = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(line, kernelLine), f[1]))
			}
		case "initrd":
			for _, w := range f[1:] {
				if !strings.HasPrefix(w, "--") {
					initrd = w
				}
			}
		case "sleep":
			if len(f) > 1 {
				retry, _ = strconv.Atoi(f[1])
			}
		}
	}
	return
}

func firstLines(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// ramdisk runs the real bcd ramdisk agent with the machine's hardware simulated.
// handed says the deploy handed the machine over to its installed OS.
func (m *machine) ramdisk(ctx context.Context, p ramdisk.Params) (handed bool, err error) {
	dir := filepath.Join(m.dir, fmt.Sprintf("ramdisk-%d", m.boots))
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	defer os.RemoveAll(dir) // a tmpfs: the identity dies with the boot
	start := time.Now()
	var joinedAt time.Time
	var claimsCalls int
	var cmu sync.Mutex
	handedCh := make(chan struct{})
	var once sync.Once
	disk := &simDisk{Root: filepath.Join(m.dir, "root"), Client: m.f.clients.client(m.ip),
		handOver: func(string) { once.Do(func() { close(handedCh) }) }}
	if m.f.cfg.SparseDisks {
		disk.Disk = filepath.Join(m.dir, "disk.img")
	}
	os.RemoveAll(disk.Root)
	deployStart := time.Time{}
	rec := &recorder{on: func(msg string, at time.Time) {
		cmu.Lock()
		defer cmu.Unlock()
		switch msg {
		case "joined":
			joinedAt = at
			m.setStage(StageJoin, at.Sub(start))
		case "deploy.image started":
			deployStart = at
		case "deploy.image succeeded":
			if !deployStart.IsZero() {
				m.setStage(StageDeploy, at.Sub(deployStart))
			}
		}
	}}
	m.mu.Lock()
	m.rec = rec
	m.mu.Unlock()
	a := &ramdisk.Agent{
		Params:  p,
		Logger:  slog.New(rec),
		DataDir: dir,
		System:  noSystem{},
		Claims: func(context.Context) protocol.Claims {
			cmu.Lock()
			defer cmu.Unlock()
			claimsCalls++
			if claimsCalls == 2 && !joinedAt.IsZero() {
				// The first call is the join's; the second the inventory command's.
				m.setStage(StageInventory, time.Since(joinedAt))
			}
			return m.claims()
		},
		Deployer:     disk,
		Machine:      noMachine{},
		BootID:       func() (string, error) { return m.bootID(), nil },
		AllowHTTP:    true,
		Backoff:      m.f.backoff,
		JoinBackoff:  m.f.backoff,
		FlushTimeout: 30 * time.Second,
	}
	runErr := a.Run(ctx)
	select {
	case <-handedCh:
		m.mu.Lock()
		m.installed = true
		m.mu.Unlock()
		return true, nil
	default:
	}
	if runErr == nil {
		runErr = errors.New("the ramdisk stopped without a hand-over")
	}
	if le := rec.lastError(); le != "" {
		runErr = fmt.Errorf("%w (last error: %s)", runErr, le)
	}
	return false, fmt.Errorf("ramdisk: %w", runErr)
}

func (m *machine) bootID() string {
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", m.index, m.boots)
}

// claims are plausible hardware claims: the machine's MAC and UUID, a serial, two
// CPUs' worth of cores, memory and one NVMe disk.
func (m *machine) claims() protocol.Claims {
	u := m.uuid
	return protocol.Claims{
		Hostname:      m.name,
		MACs:          []string{m.mac.String()},
		SystemUUID:    fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]),
		SystemSerial:  fmt.Sprintf("SIM%07d", m.index),
		SystemVendor:  "bcd sim",
		SystemProduct: "simulated machine (" + m.fw + ")",
		CPUs:          64,
		CPUModel:      "Simulated CPU @ 2.0GHz",
		MemoryBytes:   256 << 30,
		Disks:         []protocol.Disk{{Name: "nvme0n1", SizeBytes: 1920 << 30, Model: "SIM NVMe", Serial: fmt.Sprintf("SIMD%07d", m.index)}},
	}
}

// installedOS is what the deploy left on the simulated disk, booted: bcd join with
// the token file and node id the deploy wrote (attestor provisioned), then a node
// session until the machine is reset or the run ends.
func (m *machine) installedOS(ctx context.Context) error {
	start := time.Now()
	root := filepath.Join(m.dir, "root")
	cfgPath := filepath.Join(root, "etc/bcd/config.toml")
	if _, err := os.Stat(cfgPath); err != nil {
		return fmt.Errorf("installed OS: no bootable disk (%v)", err)
	}
	dataDir := filepath.Join(root, "var/lib/bcd")
	id, err := agent.LoadIdentity(dataDir, nil)
	if errors.Is(err, agent.ErrNotJoined) {
		nid, rerr := os.ReadFile(filepath.Join(root, "etc/bcd/node-id"))
		if rerr != nil {
			return fmt.Errorf("installed OS: %w", rerr)
		}
		o := join.Options{
			ConfigPath: cfgPath, DataDir: dataDir, Attestor: protocol.AttestorProvisioned,
			NodeID: strings.TrimSpace(string(nid)), TokenFile: filepath.Join(root, "etc/bcd/join-token"),
			Getenv: func(string) string { return "" }, Stdin: strings.NewReader(""),
			IsRoot: func() bool { return false }, Claims: func(context.Context) protocol.Claims { return m.claims() },
			Backoff: m.f.backoff, GiveUpAfter: 10 * time.Minute,
		}
		if err := join.Run(ctx, o); err != nil {
			return fmt.Errorf("installed OS: bcd join: %w", err)
		}
		m.setStage(StageNodeJoin, time.Since(start))
		id, err = agent.LoadIdentity(dataDir, nil)
	}
	if err != nil {
		return fmt.Errorf("installed OS: identity: %w", err)
	}
	c, err := config.Load(cfgPath, config.ParseOptions{})
	if err != nil {
		return fmt.Errorf("installed OS: %w", err)
	}
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return fmt.Errorf("installed OS: %w", err)
	}
	j, err := journal.Open(filepath.Join(dataDir, journal.FileName), id.NodeID, journal.Options{})
	if err != nil {
		return fmt.Errorf("installed OS: %w", err)
	}
	defer j.Close()
	claims := m.claims()
	sessStart := time.Now()
	var s *agent.Session
	s = &agent.Session{
		GatewayURL: c.GatewayURL, ServerName: serverName, ServingCAPin: c.ServingCASPKIPin,
		Identity: id, Journal: j, Handlers: map[string]agent.Handler{},
		// bcd sim never self-updates: the daemon section is SectionUnsupported.
		OnSpec: func(_ context.Context, spec protocol.Spec) { s.ReportDaemonUnsupported(spec) },
		OnWelcome: func(_ context.Context, _ protocol.Welcome, first bool) {
			m.mu.Lock()
			if !m.welcomed {
				m.welcomed = true
				m.stages[StageSession] = time.Since(sessStart)
			}
			m.mu.Unlock()
		},
		Claims: &claims, BootID: m.bootID(), Backoff: m.f.backoff,
		PingInterval: m.f.cfg.PingInterval,
	}
	err = s.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("installed OS: node session: %w", err)
}

// noSystem is the ramdisk's System: the machine's network is already up (its
// address is sim's), and there is nothing to prepare.
type noSystem struct{}

func (noSystem) Prepare(context.Context, *slog.Logger) error { return nil }
func (noSystem) Network(context.Context, *slog.Logger) error { return nil }

// noMachine is the ramdisk's deploy.Machine: simDisk.Finish does the "kexec".
type noMachine struct{}

func (noMachine) KexecLoad(_, _ *os.File, _ string) error { return nil }
func (noMachine) KexecExec() error                        { return nil }
func (noMachine) Reboot() error                           { return nil }
func (noMachine) PowerOff() error                         { return nil }

// recorder is the ramdisk's log: it keeps the time of the messages that end a
// stage, the last error and the last warning or error, and drops the rest (a
// thousand consoles are noise).
type recorder struct {
	on    func(msg string, at time.Time)
	mu    sync.Mutex
	last  string
	note  string
	attrs []slog.Attr
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.on(rec.Message, rec.Time)
	if rec.Level >= slog.LevelWarn {
		msg := rec.Message
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" || a.Key == "reason" || a.Key == "code" || a.Key == "message" {
				msg += " " + a.Key + "=" + a.Value.String()
			}
			return true
		})
		r.mu.Lock()
		r.note = rec.Time.Format("15:04:05 ") + msg
		if rec.Level >= slog.LevelError {
			r.last = msg
		}
		r.mu.Unlock()
	}
	return nil
}

func (r *recorder) lastNote() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.note
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) lastError() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
