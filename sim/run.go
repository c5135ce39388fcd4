package sim

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/protocol"
)

// Config is one run of bcd sim. Machines, Site, API, OperatorToken, ServingCAPin,
// FirstIP, BMCAddr and WorkDir are required.
type Config struct {
	// Machines is how many machines to play.
	Machines int
	// Site is the site the machines are added to (the site agent's site).
	Site string
	// API is better-compute serve's api (https://host:port), OperatorToken an
	// operator token for it, ServingCAPin the serving CA pin its certificate chains to.
	API, OperatorToken, ServingCAPin string
	// FirstIP is machine 0's address; machine i has FirstIP+i. Each must be an
	// address of this host (in sim's network namespace) on the site's boot network.
	FirstIP netip.Addr
	// BMCAddr is where the simulated BMCs listen, machine i's on port BMCPort+i
	// (default 16000); the site's bcx-ipmi must reach it.
	BMCAddr netip.Addr
	BMCPort int
	// ImageListen is where sim serves the image it deploys (default FirstIP's
	// network's BMCAddr:8090); ImageSize its size (default 8 MiB).
	ImageListen string
	ImageSize   int64
	// WorkDir holds each machine's ramdisk data, simulated root and disk.
	WorkDir string
	// Name prefixes the machines' names (default "sim"): sim-00001, …
	Name string
	// UEFIShare is the fraction of machines that boot UEFI (the rest BIOS);
	// default 0.5.
	UEFIShare float64
	// KernelBoot is how long the ramdisk's kernel takes to boot, after the initrd
	// is loaded and before bcd ramdisk joins (±25 %; default 1.5 s; negative: none).
	KernelBoot time.Duration
	// SparseDisks writes each image to a sparse file; otherwise it is only hashed.
	SparseDisks bool
	// Timeout bounds the whole run, from the first deploy (default 20 minutes).
	Timeout time.Duration
	// Parallel bounds the api calls in flight while adding and deploying (default 16).
	Parallel int
	// PingInterval is the node sessions' heartbeat (zero: the session's default).
	PingInterval time.Duration
	// Watch are processes whose peak memory and CPU the result reports ("serve"
	// and "site" by convention): each function gives the process's PID now, so a
	// service a fault restarted is followed to its new process.
	Watch map[string]func() int
	// Faults run during the run, each after its delay from the first deploy
	// (restart serve, restart the site agent: the caller's functions).
	Faults []Fault
	// Keep leaves the machines registered and their sessions up until ctx ends:
	// Run then returns only when ctx is done (the result is printed first).
	Keep bool
	// OnResult, if set, receives the result before a Keep run waits for ctx.
	OnResult func(*Result)
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// FirmwareCommand runs the firmware child (FirmwareMain); empty means this
	// executable with FirmwareArgs (bcd sim firmware).
	FirmwareCommand []string
}

// Fault is something done to the fleet's services during a run.
type Fault struct {
	Name  string
	After time.Duration
	Do    func(ctx context.Context) error
}

// Result is what a run did.
type Result struct {
	Machines    int `json:"machines"`
	Provisioned int `json:"provisioned"`
	// Failed maps a machine to the reason the control plane gives.
	Failed map[string]string `json:"failed,omitempty"`
	// Stuck are machines neither provisioned nor failed when the run ended: the
	// control plane's state and reason, and where sim's machine was.
	Stuck map[string]string `json:"stuck,omitempty"`
	// StuckWhere counts the stuck machines by the control plane's state and the
	// stage sim's machine had not finished ("pxe-booting/join").
	StuckWhere map[string]int `json:"stuck_where,omitempty"`
	// Interrupted says the run was stopped (a signal) before every machine
	// settled; its timelines were not checked.
	Interrupted bool `json:"interrupted,omitempty"`
	// Incomplete maps a provisioned machine to what its timeline misses.
	Incomplete map[string]string `json:"incomplete,omitempty"`
	// Sessions counts the provisioned machines whose node session was welcomed.
	Sessions int `json:"sessions"`
	// Registration is the time to add every machine; Provision from the first
	// deploy to the last machine provisioned (or the run's end).
	Registration time.Duration `json:"registration_ns"`
	Provision    time.Duration `json:"provision_ns"`
	// Stages are each stage's p50/p99/max over the provisioned machines.
	Stages map[string]StageStats `json:"stages"`
	// Boots counts the machines' power-ons and resets; Retransmits their DHCP and
	// TFTP packets sent again.
	Boots       int `json:"boots"`
	Retransmits int `json:"retransmits"`
	// Processes are the watched processes' peak RSS and CPU during the run,
	// sim's own (SimProcess) among them.
	Processes map[string]ProcStats `json:"processes,omitempty"`
	// SimPeakRSS is this process's.
	SimPeakRSS int64 `json:"sim_peak_rss_bytes"`
	// Load is the host's load average during the run.
	Load   Load     `json:"load"`
	Faults []string `json:"faults,omitempty"`
	// MachineNames lists the machines played, in order.
	MachineNames []string `json:"machine_names"`
}

// SimProcess is sim's own entry in Result.Processes.
const SimProcess = "sim"

// StageStats are one stage's durations.
type StageStats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// OK says every machine ended provisioned with a complete timeline and a session.
func (r *Result) OK() bool {
	return r.Provisioned == r.Machines && len(r.Stuck) == 0 && len(r.Incomplete) == 0 && r.Sessions == r.Provisioned
}

// Settled says every machine ended provisioned or failed with a reason: none stuck
// and no provisioned one with a broken timeline.
func (r *Result) Settled() bool {
	if len(r.Stuck) > 0 || len(r.Incomplete) > 0 {
		return false
	}
	for _, why := range r.Failed {
		if strings.TrimSpace(why) == "" {
			return false
		}
	}
	return r.Provisioned+len(r.Failed) == r.Machines
}

// fleet is a run's shared state.
type fleet struct {
	ctx      context.Context
	cfg      Config
	op       *operator
	fw       *firmwareProc
	machines []*machine
	backoff  agent.Backoff
	logMu    sync.Mutex
	// clients are the ramdisks' (the image download's) HTTP clients.
	clients *ipClients
}

func (f *fleet) logf(format string, args ...any) {
	if f.cfg.Log == nil {
		return
	}
	f.logMu.Lock()
	defer f.logMu.Unlock()
	fmt.Fprintf(f.cfg.Log, "%s sim: %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

func (c *Config) check() error {
	var bad []string
	if c.Machines <= 0 || c.Machines > 60000 {
		bad = append(bad, fmt.Sprintf("machines %d: want 1 to 60000", c.Machines))
	}
	if !protocol.ValidName(c.Site) {
		bad = append(bad, fmt.Sprintf("site %q: %s", c.Site, protocol.NameRule))
	}
	if c.API == "" {
		bad = append(bad, "api: required (better-compute serve's https://host:port)")
	}
	if c.OperatorToken == "" {
		bad = append(bad, "operator token: required")
	}
	if c.ServingCAPin == "" {
		bad = append(bad, "serving CA pin: required (serving_ca_spki_pin of the site's config.toml)")
	}
	if !c.FirstIP.Is4() {
		bad = append(bad, "first ip: want the IPv4 address of machine 0")
	}
	if !c.BMCAddr.Is4() {
		bad = append(bad, "bmc address: want an IPv4 address for the simulated BMCs")
	}
	if c.WorkDir == "" {
		bad = append(bad, "work dir: required")
	}
	if c.UEFIShare < 0 || c.UEFIShare > 1 {
		bad = append(bad, fmt.Sprintf("uefi share %v: want 0 to 1", c.UEFIShare))
	}
	if len(bad) > 0 {
		return fmt.Errorf("bcd sim: %s", strings.Join(bad, "; "))
	}
	if c.BMCPort == 0 {
		c.BMCPort = 16000
	}
	if c.BMCPort+c.Machines > 65535 {
		return fmt.Errorf("bcd sim: bmc port %d + %d machines passes 65535", c.BMCPort, c.Machines)
	}
	if c.ImageSize == 0 {
		c.ImageSize = 8 << 20
	}
	if c.ImageListen == "" {
		c.ImageListen = netip.AddrPortFrom(c.BMCAddr, 8090).String()
	}
	if c.Name == "" {
		c.Name = "sim"
	}
	if c.Timeout == 0 {
		c.Timeout = 20 * time.Minute
	}
	if c.KernelBoot == 0 {
		c.KernelBoot = 1500 * time.Millisecond
	}
	if c.Parallel <= 0 {
		c.Parallel = 16
	}
	return nil
}

// machineIP is FirstIP + i.
func machineIP(first netip.Addr, i int) netip.Addr {
	a := first.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Run plays the fleet: it starts the BMCs and the image server, adds the machines
// (deleting any left by an earlier run of the same names), deploys every one at
// once (the storm), waits until each is provisioned or failed or the timeout ends,
// checks every timeline and returns the result. The process must be in the network
// namespace that holds the machines' addresses.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	op, err := newOperator(cfg.API, cfg.OperatorToken, cfg.ServingCAPin)
	if err != nil {
		return nil, fmt.Errorf("bcd sim: %w", err)
	}
	rctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	f := &fleet{ctx: rctx, cfg: cfg, op: op, clients: newIPClients(),
		backoff: agent.Backoff{Initial: 500 * time.Millisecond, Max: 10 * time.Second}}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("bcd sim: %w", err)
	}
	img, err := startImage(rctx, cfg.ImageListen, cfg.ImageSize)
	if err != nil {
		return nil, err
	}
	defer img.close()
	f.logf("image: %s (%d bytes, sha256 %s…)", img.url, img.size, img.sha[:12])

	if err := f.makeMachines(); err != nil {
		return nil, err
	}
	fw, fwErr := startFirmware(rctx, f, cfg.FirmwareCommand)
	if fwErr == nil {
		f.fw = fw
		// Run after the machines' power off below: their boots end first.
		defer fw.stop()
	}
	defer func() {
		for _, m := range f.machines {
			m.power(powerOff)
			if m.bmc != nil {
				m.bmc.close()
			}
		}
		for _, m := range f.machines {
			m.mu.Lock()
			r := m.running
			m.mu.Unlock()
			if r != nil {
				<-r
			}
		}
	}()

	if fwErr != nil {
		return nil, fwErr
	}

	res := &Result{Machines: cfg.Machines, Failed: map[string]string{}, Stuck: map[string]string{},
		Incomplete: map[string]string{}, Stages: map[string]StageStats{}}
	for _, m := range f.machines {
		res.MachineNames = append(res.MachineNames, m.name)
	}
	t := time.Now()
	if err := f.register(rctx); err != nil {
		return nil, err
	}
	res.Registration = time.Since(t)
	f.logf("%d machines added in %s", cfg.Machines, res.Registration.Round(time.Millisecond))

	// sim itself beside the services it measures: on two cores its CPU is
	// theirs to lose.
	watched := map[string]func() int{SimProcess: os.Getpid, FirmwareProcess: f.fw.pid}
	for n, fn := range cfg.Watch {
		watched[n] = fn
	}
	watch := startWatch(watched)
	start := time.Now()
	deployCtx, cancelDeploy := context.WithTimeout(rctx, cfg.Timeout)
	defer cancelDeploy()
	var faultWG sync.WaitGroup
	var faultMu sync.Mutex
	for _, fl := range cfg.Faults {
		faultWG.Add(1)
		go func() {
			defer faultWG.Done()
			if !agent.Sleep(deployCtx, fl.After) {
				return
			}
			f.logf("fault: %s", fl.Name)
			err := fl.Do(deployCtx)
			msg := fmt.Sprintf("%s at +%s", fl.Name, time.Since(start).Round(time.Second))
			if err != nil {
				msg += ": " + err.Error()
			}
			faultMu.Lock()
			res.Faults = append(res.Faults, msg)
			faultMu.Unlock()
		}()
	}
	if err := f.deployAll(deployCtx, img); err != nil {
		return nil, err
	}
	f.logf("%d deployments started in %s", cfg.Machines, time.Since(start).Round(time.Millisecond))
	final := f.wait(deployCtx, start)
	res.Provision = time.Since(start)
	faultWG.Wait()
	res.Processes, res.Load = watch.stop()
	res.SimPeakRSS = selfPeakRSS()
	if p, ok := res.Processes[SimProcess]; ok {
		// VmHWM: the true peak, where sampling may miss one.
		p.PeakRSS = max(p.PeakRSS, res.SimPeakRSS)
		res.Processes[SimProcess] = p
	}

	var stageVals = map[string][]time.Duration{}
	for _, m := range f.machines {
		st := final[m.name]
		m.mu.Lock()
		res.Boots += m.boots
		res.Retransmits += m.retrans
		welcomed, stages, lastErr := m.welcomed, maps(m.stages), m.lastErr
		m.mu.Unlock()
		switch st.State {
		case "provisioned":
			res.Provisioned++
			if welcomed {
				res.Sessions++
			}
			for k, v := range stages {
				stageVals[k] = append(stageVals[k], v)
			}
		case "failed":
			why := st.StateReason
			if lastErr != "" {
				why += " (sim: " + lastErr + ")"
			}
			res.Failed[m.name] = why
		default:
			state := st.State
			if state == "" {
				state = "unknown"
			}
			stage, detail := m.where()
			if detail != "" {
				detail = ", " + detail
			}
			why := fmt.Sprintf("%s since %s: %s (sim: in %s%s)", state, st.ChangedAt.Format(time.TimeOnly), st.StateReason, stage, detail)
			res.Stuck[m.name] = why
			if res.StuckWhere == nil {
				res.StuckWhere = map[string]int{}
			}
			res.StuckWhere[state+"/"+stage]++
		}
	}
	for k, v := range stageVals {
		res.Stages[k] = stats(v)
	}
	if ctx.Err() != nil {
		// Interrupted: the api calls of the timeline check would fail for it.
		res.Interrupted = true
	} else {
		f.checkTimelines(rctx, final, res)
	}
	if cfg.Keep {
		if cfg.OnResult != nil {
			cfg.OnResult(res)
		}
		<-ctx.Done()
	}
	return res, nil
}

func maps(m map[string]time.Duration) map[string]time.Duration {
	out := make(map[string]time.Duration, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func stats(v []time.Duration) StageStats {
	slices.Sort(v)
	q := func(p float64) time.Duration {
		i := int(float64(len(v)-1) * p)
		return v[i]
	}
	return StageStats{N: len(v), P50: q(0.5), P99: q(0.99), Max: v[len(v)-1]}
}

func (f *fleet) makeMachines() error {
	cfg := f.cfg
	for i := 0; i < cfg.Machines; i++ {
		m := &machine{f: f, index: i, name: fmt.Sprintf("%s-%05d", cfg.Name, i),
			mac: net.HardwareAddr{0x02, 0xbc, 0x51, byte(i >> 16), byte(i >> 8), byte(i)}, ip: machineIP(cfg.FirstIP, i),
			fw: FirmwareBIOS, stages: map[string]time.Duration{}}
		if float64(i%100) < cfg.UEFIShare*100 && cfg.UEFIShare > 0 && i%2 == 1 || cfg.UEFIShare == 1 {
			m.fw = FirmwareUEFI
		}
		rand.Read(m.uuid[:])
		m.uuid[6] = m.uuid[6]&0x0f | 0x40
		m.uuid[8] = m.uuid[8]&0x3f | 0x80
		var pw [9]byte // 18 characters: BMCs take passwords of at most 20
		rand.Read(pw[:])
		m.password = hex.EncodeToString(pw[:])
		m.dir = filepath.Join(cfg.WorkDir, m.name)
		os.RemoveAll(m.dir)
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return fmt.Errorf("bcd sim: %w", err)
		}
		m.chassis = &chassis{act: m.power}
		var err error
		if m.bmc, err = startBMC(f.ctx, netip.AddrPortFrom(cfg.BMCAddr, uint16(cfg.BMCPort+i)), m.password, m.uuid, m.chassis); err != nil {
			return err
		}
		f.machines = append(f.machines, m)
	}
	return nil
}

// parallel runs fn for every machine, at most f.cfg.Parallel at a time, and returns
// the first error.
func (f *fleet) parallel(ctx context.Context, fn func(context.Context, *machine) error) error {
	sem := make(chan struct{}, f.cfg.Parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, m := range f.machines {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, m); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func (f *fleet) register(ctx context.Context) error {
	return f.parallel(ctx, func(ctx context.Context, m *machine) error {
		pw := m.password
		fw := "bios"
		if m.fw == FirmwareUEFI {
			fw = "uefi"
		}
		in := apiMachineCreate{Site: f.cfg.Site, Name: m.name, MACs: []string{m.mac.String()}, Firmware: fw,
			BMC: &apiBMC{Address: f.cfg.BMCAddr.String(), Port: f.cfg.BMCPort + m.index, Username: BMCUser, Password: &pw, CipherSuite: 3}}
		err := f.op.addMachine(ctx, in)
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusConflict {
			// Left by an earlier run, by this name or (another --name) with this
			// MAC: a machine of a run is new.
			for _, ref := range []string{m.name, m.mac.String()} {
				err := f.deleteLeftover(ctx, ref)
				if err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound) {
					return fmt.Errorf("bcd sim: machine %s exists and does not delete: %w", ref, err)
				}
			}
			err = f.op.addMachine(ctx, in)
		}
		if err != nil {
			return fmt.Errorf("bcd sim: machines add %s: %w", m.name, err)
		}
		return nil
	})
}

// deleteLeftover deletes machine ref left by an earlier run. One whose
// deployment still runs is cancelled first, as the refusal says; that
// deployment may end by itself between the refusal and the cancel (the
// earlier run's lifecycle still works on it), and then the cancel is refused
// as already ended and the delete is simply tried again.
func (f *fleet) deleteLeftover(ctx context.Context, ref string) error {
	var err error
	for range 3 {
		err = f.op.deleteMachine(ctx, ref)
		var ae *APIError
		if !(errors.As(err, &ae) && ae.Status == http.StatusConflict && strings.Contains(ae.Body, protocol.CodeMachineBusy)) {
			return err
		}
		err = f.op.cancel(ctx, ref)
		if errors.As(err, &ae) && ae.Status == http.StatusBadRequest && strings.Contains(ae.Body, protocol.CodeInvalidInput) {
			continue // ended meanwhile
		}
		if err != nil {
			return err
		}
	}
	return err
}

func (f *fleet) deployAll(ctx context.Context, img *image) error {
	d := apiDeploy{Image: apiImage{URL: img.url, SHA256: img.sha, Size: img.size, Format: protocol.FormatRaw},
		After: protocol.AfterKexec}
	return f.parallel(ctx, func(ctx context.Context, m *machine) error {
		if err := f.op.deploy(ctx, m.name, d); err != nil {
			return fmt.Errorf("bcd sim: machines deploy %s: %w", m.name, err)
		}
		return nil
	})
}

// wait polls the machine list until every machine is provisioned or failed, or ctx
// ends; it returns each machine's last state.
func (f *fleet) wait(ctx context.Context, start time.Time) map[string]apiMachine {
	last := map[string]apiMachine{}
	mine := map[string]bool{}
	for _, m := range f.machines {
		mine[m.name] = true
	}
	report, progress := time.Now(), time.Now()
	for {
		ms, err := f.op.machines(ctx)
		if err == nil {
			counts := map[string]int{}
			done := 0
			for _, m := range ms {
				if !mine[m.Name] {
					continue
				}
				last[m.Name] = m
				counts[m.State]++
				if m.State == "provisioned" || m.State == "failed" {
					done++
				}
			}
			if time.Since(report) > 10*time.Second || done == len(f.machines) {
				report = time.Now()
				f.logf("+%s %v", time.Since(start).Round(time.Second), counts)
			}
			if time.Since(progress) >= ProgressInterval {
				progress = time.Now()
				f.logf("%s", f.progress(time.Since(start), last))
			}
			if done == len(f.machines) {
				// Sessions that were welcomed after the state changed are counted
				// once they are: give the last ones a moment.
				f.waitWelcomes(ctx, last, 30*time.Second)
				return last
			}
		} else if ctx.Err() == nil {
			f.logf("machines list: %v (serve restarting?)", err)
		}
		if !agent.Sleep(ctx, 2*time.Second) {
			return last
		}
	}
}

// ProgressInterval is how often a run logs its progress line (Progress).
const ProgressInterval = 30 * time.Second

// Progress marks the progress lines in a run's log: a caller that shows no
// other line of it (fleetbench without -v) shows these.
const Progress = "progress:"

// progress is a progress line: the machines by the control plane's state, and
// the unsettled ones by state and the stage sim's machine has not finished.
func (f *fleet) progress(at time.Duration, last map[string]apiMachine) string {
	settled := map[string]int{}
	where := map[string]int{}
	for _, m := range f.machines {
		st := last[m.name].State
		if st == "provisioned" || st == "failed" {
			settled[st]++
			continue
		}
		if st == "" {
			st = "unknown"
		}
		stage, _ := m.where()
		where[st+"/"+stage]++
	}
	return fmt.Sprintf("%s +%s: %d provisioned, %d failed, %d unsettled%s", Progress, at.Round(time.Second),
		settled["provisioned"], settled["failed"], len(f.machines)-settled["provisioned"]-settled["failed"], countList(where))
}

// countList is " (a 3, b 1)", largest first, or "" for none.
func countList(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func (f *fleet) waitWelcomes(ctx context.Context, last map[string]apiMachine, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		missing := 0
		for _, m := range f.machines {
			m.mu.Lock()
			if last[m.name].State == "provisioned" && !m.welcomed {
				missing++
			}
			m.mu.Unlock()
		}
		if missing == 0 || !agent.Sleep(ctx, 200*time.Millisecond) {
			return
		}
	}
}

// timelineNeeds are the event kinds every provisioned machine's timeline holds:
// added, booted (the site's reports), its nonce, both joins, the deploy command
// and its statuses, the deploy's end, the node ready.
var timelineNeeds = []string{protocol.MachineEventAdded, protocol.EventMachineBooted, protocol.EventBootNonce,
	protocol.MachineEventJoin, protocol.MachineEventCommand, protocol.MachineEventCommandStatus,
	protocol.MachineEventDeployDone, protocol.MachineEventNodeReady, protocol.MachineEventState}

// timelineStates are the lifecycle states a provisioned machine's state events pass.
var timelineStates = []string{"pxe-booting", "ramdisk", "deploying", "installing", "provisioned"}

func (f *fleet) checkTimelines(ctx context.Context, final map[string]apiMachine, res *Result) {
	var mu sync.Mutex
	_ = f.parallel(ctx, func(ctx context.Context, m *machine) error {
		if final[m.name].State != "provisioned" {
			return nil
		}
		evs, err := f.op.events(ctx, m.name)
		miss := []string{}
		if err != nil {
			miss = append(miss, "events: "+err.Error())
		} else {
			have := map[string]bool{}
			text := ""
			for _, e := range evs {
				have[e.Kind] = true
				if e.Kind == protocol.MachineEventState {
					text += " " + e.Message
				}
			}
			for _, k := range timelineNeeds {
				if !have[k] {
					miss = append(miss, k)
				}
			}
			for _, s := range timelineStates {
				if !strings.Contains(text, s) {
					miss = append(miss, "state "+s)
				}
			}
			if len(evs) > 0 && evs[len(evs)-1].Kind == "" {
				miss = append(miss, "an event without a kind")
			}
		}
		if len(miss) > 0 {
			mu.Lock()
			res.Incomplete[m.name] = strings.Join(miss, ", ")
			mu.Unlock()
		}
		return nil
	})
}

// image is the raw image sim deploys, served over HTTP from sim's namespace: the
// first MiB random (the part a digest check cannot guess), the rest a pattern
// with zero blocks, as an OS image is mostly.
type image struct {
	url  string
	sha  string
	size int64
	srv  *http.Server
}

func startImage(ctx context.Context, listen string, size int64) (*image, error) {
	head := make([]byte, min(size, 1<<20))
	mr := mrand.New(mrand.NewPCG(1, 2))
	for i := range head {
		head[i] = byte(mr.Uint32())
	}
	gen := func() io.Reader {
		return io.MultiReader(bytesReader(head), &patternReader{left: size - int64(len(head))})
	}
	h := sha256.New()
	io.Copy(h, gen())
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("bcd sim: the image server on %s: %w", listen, err)
	}
	img := &image{url: "http://" + ln.Addr().String() + "/image.raw", sha: hex.EncodeToString(h.Sum(nil)), size: size}
	img.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/image.raw" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(size))
		io.Copy(w, gen())
	})}
	go img.srv.Serve(ln)
	return img, nil
}

func (i *image) close() { i.srv.Close() }

type byteReader struct {
	b []byte
}

func bytesReader(b []byte) io.Reader { return &byteReader{b: b} }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// patternReader yields left bytes: every fourth 4 KiB block holds its own offset,
// the others are zero. Byte o of a marked block's first 8 is byte(o >> (8·(o%8))).
// It clears the buffer and sets the marked bytes only: a byte at a time, it was
// a third of sim's CPU in a 1,000-machine storm (8 GiB served), taken from the
// serve and site agent it measures on the same cores.
type patternReader struct {
	off, left int64
}

const patternBlock = 4096

func (r *patternReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	clear(p)
	end := r.off + int64(len(p))
	for blk := r.off - r.off%patternBlock; blk < end; blk += patternBlock {
		if (blk/patternBlock)%4 != 0 {
			continue
		}
		for o := max(blk, r.off); o < min(blk+8, end); o++ {
			p[o-r.off] = byte(o >> (8 * (o % 8)))
		}
	}
	r.off = end
	r.left -= int64(len(p))
	return len(p), nil
}

// String is the result as the run prints it.
func (r *Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bcd sim: %d machines: %d provisioned, %d failed, %d stuck; %d node sessions welcomed; %d timelines incomplete\n",
		r.Machines, r.Provisioned, len(r.Failed), len(r.Stuck), r.Sessions, len(r.Incomplete))
	fmt.Fprintf(&b, "registration %s; first deploy to all settled %s; %d boots, %d retransmits\n",
		r.Registration.Round(time.Millisecond), r.Provision.Round(time.Millisecond), r.Boots, r.Retransmits)
	fmt.Fprintf(&b, "%-10s %6s %10s %10s %10s\n", "stage", "n", "p50", "p99", "max")
	for _, s := range Stages {
		st, ok := r.Stages[s]
		if !ok {
			fmt.Fprintf(&b, "%-10s %6d\n", s, 0)
			continue
		}
		fmt.Fprintf(&b, "%-10s %6d %10s %10s %10s\n", s, st.N, round(st.P50), round(st.P99), round(st.Max))
	}
	names := make([]string, 0, len(r.Processes))
	for n := range r.Processes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := r.Processes[n]
		fmt.Fprintf(&b, "%-8s peak RSS %6.1f MiB, CPU %7.1f s (%.0f%% of one core over the run)\n", n,
			float64(p.PeakRSS)/(1<<20), p.CPU.Seconds(), 100*p.CPU.Seconds()/max(r.Provision.Seconds(), 0.001))
	}
	if _, ok := r.Processes[SimProcess]; !ok {
		fmt.Fprintf(&b, "%-8s peak RSS %6.1f MiB\n", SimProcess, float64(r.SimPeakRSS)/(1<<20))
	}
	if l := r.Load; l.CPUs > 0 {
		fmt.Fprintf(&b, "host     load average: peak %.2f (1 min) during the run, %.2f %.2f %.2f at its end, %d CPUs\n",
			l.Peak1, l.End[0], l.End[1], l.End[2], l.CPUs)
	}
	for _, fl := range r.Faults {
		fmt.Fprintf(&b, "fault: %s\n", fl)
	}
	if r.Interrupted {
		fmt.Fprintf(&b, "interrupted before every machine settled; timelines not checked\n")
	}
	if len(r.StuckWhere) > 0 {
		fmt.Fprintf(&b, "stuck by control plane state/sim stage:%s\n", countList(r.StuckWhere))
	}
	list := func(title string, m map[string]string) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if i == 20 {
				fmt.Fprintf(&b, "  … and %d more\n", len(keys)-20)
				break
			}
			fmt.Fprintf(&b, "%s %s: %s\n", title, k, m[k])
		}
	}
	list("failed", r.Failed)
	list("stuck", r.Stuck)
	list("incomplete", r.Incomplete)
	return b.String()
}

func round(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Microsecond).String()
}
