package sim

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/internal/spawn"
	"github.com/better-compute/bcd/internal/syncbuf"
)

// The machines' firmware (DHCP, TFTP, the iPXE script, kernel and initrd) runs in
// a child process, bcd sim firmware, at a higher priority than sim (FirmwareNice).
// On two cores sim's own work (joins, deploys, hashing 8 GiB of images) would
// otherwise delay the firmware's retransmit timers and its reads, and the storm's
// DHCP and TFTP latencies would be sim's, not the site's. The two speak JSON lines
// over the child's stdin and stdout: one init (the machines), then boot and cancel
// requests, answered by id. The child dies with sim (PR_SET_PDEATHSIG) and ends
// when its stdin does.

// FirmwareArgs are the arguments of bcd that run FirmwareMain: the hidden
// subcommand bcd sim firmware.
var FirmwareArgs = []string{"sim", "firmware"}

// FirmwareNice is the firmware child's nice value relative to sim's.
const FirmwareNice = -10

// FirmwareProcess is the firmware child's entry in Result.Processes.
const FirmwareProcess = "firmware"

// fwMachine is what the firmware child knows of a machine.
type fwMachine struct {
	Name string     `json:"name"`
	MAC  string     `json:"mac"`
	IP   netip.Addr `json:"ip"`
	FW   string     `json:"fw"`
	GUID []byte     `json:"guid"`
}

// fwRequest is a line from sim to the child: init (Machines; the first line),
// boot (run machine Index's firmware once, answered with ID), cancel (stop boot ID).
type fwRequest struct {
	Op       string      `json:"op"`
	Machines []fwMachine `json:"machines,omitempty"`
	ID       uint64      `json:"id,omitempty"`
	Index    int         `json:"index,omitempty"`
}

// fwAnswer is a line from the child: ready (every machine's socket is bound), or
// boot ID's outcome: the stages it finished, its retransmits, and what the iPXE
// script said (the ramdisk kernel's command line, or boot the local disk), or why
// it failed.
type fwAnswer struct {
	Op          string                   `json:"op"`
	ID          uint64                   `json:"id,omitempty"`
	Stages      map[string]time.Duration `json:"stages,omitempty"`
	Retransmits int                      `json:"retransmits,omitempty"`
	Local       bool                     `json:"local,omitempty"`
	Args        string                   `json:"args,omitempty"`
	Err         string                   `json:"error,omitempty"`
}

const (
	fwInit   = "init"
	fwReady  = "ready"
	fwBoot   = "boot"
	fwCancel = "cancel"
)

// FirmwareMain is bcd sim firmware: it binds each machine's DHCP client socket,
// answers ready, then runs each boot request's firmware and answers its outcome,
// until in ends (sim is done) or ctx does.
func FirmwareMain(ctx context.Context, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dec := json.NewDecoder(bufio.NewReaderSize(in, 1<<20))
	var init fwRequest
	if err := dec.Decode(&init); err != nil {
		return fmt.Errorf("bcd sim firmware: the first line (the machines): %w", err)
	}
	if init.Op != fwInit {
		return fmt.Errorf("bcd sim firmware: the first line is %q, want %q", init.Op, fwInit)
	}
	h := &fwHost{clients: newIPClients()}
	// The machines' sockets first: an address that is not sim's fails before
	// anything listens on the wildcard port 68.
	for _, fm := range init.Machines {
		mac, err := net.ParseMAC(fm.MAC)
		if err != nil {
			return fmt.Errorf("bcd sim firmware: machine %s: mac %q: %w", fm.Name, fm.MAC, err)
		}
		conn, err := listenUDP(netip.AddrPortFrom(fm.IP, 68).String())
		if err != nil {
			return fmt.Errorf("bcd sim: machine %s's address %s (is it on sim's interface?): %w", fm.Name, fm.IP, err)
		}
		defer conn.Close()
		h.machines = append(h.machines, &fwState{ip: fm.IP, dhcp: &pxeClient{conn: conn, mac: mac, ip: fm.IP, fw: fm.FW, guid: fm.GUID}})
	}
	if len(h.machines) > 0 {
		bus, err := newDHCPBus()
		if err != nil {
			return err
		}
		defer bus.close()
		for _, m := range h.machines {
			m.dhcp.bus = bus
			go m.dhcp.readDirect()
		}
	}
	var outMu sync.Mutex
	enc := json.NewEncoder(out)
	send := func(a fwAnswer) error {
		outMu.Lock()
		defer outMu.Unlock()
		return enc.Encode(a)
	}
	if err := send(fwAnswer{Op: fwReady}); err != nil {
		return err
	}
	var mu sync.Mutex
	running := map[uint64]context.CancelFunc{}
	for {
		var r fwRequest
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				return nil // sim is done with us
			}
			return fmt.Errorf("bcd sim firmware: a request: %w", err)
		}
		switch r.Op {
		case fwBoot:
			if r.Index < 0 || r.Index >= len(h.machines) {
				send(fwAnswer{Op: fwBoot, ID: r.ID, Err: fmt.Sprintf("no machine %d (%d machines)", r.Index, len(h.machines))})
				continue
			}
			bctx, bcancel := context.WithCancel(ctx)
			mu.Lock()
			running[r.ID] = bcancel
			mu.Unlock()
			go func() {
				a := h.boot(bctx, h.machines[r.Index])
				mu.Lock()
				delete(running, r.ID)
				mu.Unlock()
				bcancel()
				a.Op, a.ID = fwBoot, r.ID
				send(a)
			}()
		case fwCancel:
			mu.Lock()
			if c := running[r.ID]; c != nil {
				c()
			}
			mu.Unlock()
		default:
			return fmt.Errorf("bcd sim firmware: a request of op %q", r.Op)
		}
	}
}

// fwHost is the firmware child's machines.
type fwHost struct {
	clients  *ipClients
	machines []*fwState
}

// fwState is one machine in the firmware child. mu keeps its boots one at a time:
// a cancelled boot lets go of the machine's socket before the next one uses it.
type fwState struct {
	mu   sync.Mutex
	ip   netip.Addr
	dhcp *pxeClient
}

// boot is PXE ROM then iPXE: both DHCP rounds, TFTP of the boot file, the iPXE
// script, and its kernel and initrd.
func (h *fwHost) boot(ctx context.Context, m *fwState) (a fwAnswer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.Stages = map[string]time.Duration{}
	before := m.dhcp.Retransmits
	defer func() { a.Retransmits += m.dhcp.Retransmits - before }()
	fail := func(format string, args ...any) fwAnswer {
		a.Err = fmt.Sprintf(format, args...)
		return a
	}
	t := time.Now()
	o, err := m.dhcp.Discover(ctx, false)
	if err != nil {
		return fail("dhcp (PXE ROM): %v", err)
	}
	dhcp1 := time.Since(t)
	t = time.Now()
	file := strings.TrimPrefix(o.file, "/")
	if !strings.HasPrefix(file, "http://") && !strings.HasPrefix(file, "https://") {
		// The ROM loads iPXE over TFTP; an iPXE ROM would go to the script at once.
		_, _, re, err := tftpGet(ctx, m.ip, netip.AddrPortFrom(o.server, 69), file, 1468)
		a.Retransmits += re
		if err != nil {
			return fail("tftp %s from %s: %v", file, o.server, err)
		}
		a.Stages[StageTFTP] = time.Since(t)
		t = time.Now()
		if o, err = m.dhcp.Discover(ctx, true); err != nil {
			return fail("dhcp (iPXE): %v", err)
		}
	}
	a.Stages[StageDHCP] = dhcp1 + time.Since(t)
	scriptURL := o.file
	if !strings.HasPrefix(scriptURL, "http") {
		return fail("dhcp (iPXE): the offer names %q, not an iPXE script URL", scriptURL)
	}
	for try := 0; ; try++ {
		t = time.Now()
		script, err := h.clients.getText(ctx, m.ip, scriptURL)
		if err != nil {
			return fail("iPXE script %s: %v", scriptURL, err)
		}
		a.Stages[StageScript] = time.Since(t)
		kernel, args, initrd, retry := parseScript(script)
		switch {
		case kernel != "":
			t = time.Now()
			if _, err := h.clients.getDiscard(ctx, m.ip, kernel); err != nil {
				return fail("kernel %s: %v", kernel, err)
			}
			a.Stages[StageKernel] = time.Since(t)
			t = time.Now()
			if initrd != "" {
				if _, err := h.clients.getDiscard(ctx, m.ip, initrd); err != nil {
					return fail("initrd %s: %v", initrd, err)
				}
			}
			a.Stages[StageInitrd] = time.Since(t)
			a.Args = args
			return a
		case strings.Contains(script, "sanboot"):
			a.Local = true
			return a
		case retry > 0 && try < maxScriptRetries:
			if !agent.Sleep(ctx, time.Duration(retry)*time.Second) {
				return fail("%v", ctx.Err())
			}
		default:
			return fail("iPXE script %s: nothing to boot in %q", scriptURL, firstLines(script))
		}
	}
}

// firmwareProc is sim's side of the firmware child.
type firmwareProc struct {
	cmd  *exec.Cmd
	inMu sync.Mutex
	in   io.WriteCloser
	next atomic.Uint64

	mu   sync.Mutex
	wait map[uint64]chan fwAnswer
	// done is closed when the child's stdout ends; err says why.
	done chan struct{}
	err  error
	tail *syncbuf.Tail
}

// startFirmware starts the firmware child for f's machines (command: argv, or this
// executable's bcd sim firmware) and waits until it has bound their sockets.
func startFirmware(ctx context.Context, f *fleet, argv []string) (*firmwareProc, error) {
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bcd sim: the firmware child: %w", err)
		}
		argv = append([]string{exe}, FirmwareArgs...)
	}
	p := &firmwareProc{wait: map[uint64]chan fwAnswer{}, done: make(chan struct{}), tail: &syncbuf.Tail{Max: 4 << 10}}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	var logw io.Writer = io.Discard
	if f.cfg.Log != nil {
		logw = f.cfg.Log
	}
	p.cmd.Stderr = io.MultiWriter(logw, p.tail)
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := spawn.StartKilledWithUsNice(p.cmd, FirmwareNice); err != nil {
		// Without CAP_SYS_NICE the child runs at sim's priority: the run
		// works, and its DHCP and TFTP figures carry sim's load.
		f.logf("firmware child at sim's own priority: %v", err)
		if err := spawn.StartKilledWithUs(p.cmd); err != nil {
			return nil, fmt.Errorf("bcd sim: the firmware child %s: %w", argv[0], err)
		}
	}
	go func() {
		<-ctx.Done()
		p.in.Close() // the child ends with its stdin
	}()
	ready := make(chan error, 1)
	go p.read(stdout, ready)
	init := fwRequest{Op: fwInit}
	for _, m := range f.machines {
		init.Machines = append(init.Machines, fwMachine{Name: m.name, MAC: m.mac.String(), IP: m.ip, FW: m.fw,
			GUID: append([]byte{0}, m.uuid[:]...)})
	}
	if err := p.send(init); err != nil {
		p.stop()
		return nil, fmt.Errorf("bcd sim: the firmware child: %w: %s", err, strings.TrimSpace(p.tail.String()))
	}
	select {
	case err := <-ready:
		if err != nil {
			p.stop()
			return nil, err
		}
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
	return p, nil
}

// read routes the child's answers to their waiters; ready gets the first.
func (p *firmwareProc) read(r io.Reader, ready chan<- error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 1<<20))
	first := true
	var err error
	for {
		var a fwAnswer
		if err = dec.Decode(&a); err != nil {
			break
		}
		if first {
			first = false
			if a.Op != fwReady {
				err = fmt.Errorf("its first answer is %q, not %q", a.Op, fwReady)
				break
			}
			ready <- nil
			continue
		}
		p.mu.Lock()
		ch := p.wait[a.ID]
		delete(p.wait, a.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- a
		}
	}
	werr := p.cmd.Wait()
	msg := strings.TrimSpace(p.tail.String())
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:] // its last word: the error it exited with
	}
	p.err = fmt.Errorf("bcd sim: the firmware child ended (%v; %v): %s", err, werr, msg)
	if first {
		ready <- p.err
	}
	close(p.done)
}

func (p *firmwareProc) send(r fwRequest) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	_, err = p.in.Write(append(b, '\n'))
	return err
}

// boot runs machine index's firmware once in the child; a boot whose ctx ends is
// cancelled there.
func (p *firmwareProc) boot(ctx context.Context, index int) (fwAnswer, error) {
	id := p.next.Add(1)
	ch := make(chan fwAnswer, 1)
	p.mu.Lock()
	p.wait[id] = ch
	p.mu.Unlock()
	forget := func() {
		p.mu.Lock()
		delete(p.wait, id)
		p.mu.Unlock()
	}
	if err := p.send(fwRequest{Op: fwBoot, ID: id, Index: index}); err != nil {
		forget()
		select {
		case <-p.done:
			return fwAnswer{}, p.err
		default:
			return fwAnswer{}, fmt.Errorf("bcd sim: the firmware child: %w", err)
		}
	}
	select {
	case a := <-ch:
		return a, nil
	case <-ctx.Done():
		forget()
		p.send(fwRequest{Op: fwCancel, ID: id})
		return fwAnswer{}, ctx.Err()
	case <-p.done:
		return fwAnswer{}, p.err
	}
}

func (p *firmwareProc) pid() int {
	if p == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop ends the child (its stdin closed) and waits for it, killing it after 5 s.
func (p *firmwareProc) stop() {
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// ipClients are the machines' HTTP clients: a machine's connections come from its
// address, as the site's boot server sees a machine by IP.
type ipClients struct {
	mu sync.Mutex
	m  map[netip.Addr]*http.Client
}

func newIPClients() *ipClients { return &ipClients{m: map[netip.Addr]*http.Client{}} }

func (c *ipClients) client(ip netip.Addr) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.m[ip]; hc != nil {
		return hc
	}
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)), Timeout: 10 * time.Second}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2,
		IdleConnTimeout: 5 * time.Second, ResponseHeaderTimeout: 60 * time.Second}}
	c.m[ip] = hc
	return hc
}

// getText fetches a small document (the iPXE script) from the machine's address.
func (c *ipClients) getText(ctx context.Context, ip netip.Addr, u string) (string, error) {
	resp, err := c.get(ctx, ip, u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b), err
}

// getDiscard fetches a file whole, hashing it as firmware checks nothing but
// reads everything.
func (c *ipClients) getDiscard(ctx context.Context, ip netip.Addr, u string) (int64, error) {
	resp, err := c.get(ctx, ip, u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(sha256.New(), resp.Body)
}

func (c *ipClients) get(ctx context.Context, ip netip.Addr, u string) (*http.Response, error) {
	if _, err := url.Parse(u); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "iPXE/1.21.1 (bcd sim)")
	resp, err := c.client(ip).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s", resp.Status)
	}
	return resp, nil
}
