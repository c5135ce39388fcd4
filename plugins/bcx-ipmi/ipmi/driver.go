package ipmi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/better-compute/bcd/bmc"
)

// Defaults of the Driver's zero fields.
const (
	DefaultTimeout     = 2 * time.Second
	DefaultRetries     = 2
	DefaultAttempts    = 3
	DefaultMinInterval = 250 * time.Millisecond
	DefaultBackoff     = 500 * time.Millisecond
)

// Driver is a bmc.Driver speaking IPMI v2.0 over LAN (RMCP+) with a native client:
// no ipmitool, no child process, the password only in this process's memory.
//
// BMCs are slow, drop UDP datagrams, hold few sessions and lock out users after
// failed logins, so the driver is careful with them: one operation at a time per
// BMC, at least MinInterval between two, a fresh session per operation (closed
// afterwards, so none are left to expire on the BMC), every exchange resent on
// timeout, and sessions that get no answer retried with backoff. A refused password
// is never retried. An operation that is not idempotent (cycle, reset) is sent once:
// when its answer is lost, whether the BMC carried it out is unknown, and sending
// it again could cycle the machine twice.
type Driver struct {
	// Timeout bounds one UDP exchange; 0 means DefaultTimeout.
	Timeout time.Duration
	// Retries is how often one exchange is resent after a timeout; 0 means
	// DefaultRetries, a negative value none.
	Retries int
	// Attempts is how many sessions one operation may open when the BMC does not
	// answer; 0 means DefaultAttempts.
	Attempts int
	// MinInterval is the least time between two operations on one BMC; 0 means
	// DefaultMinInterval, a negative value none.
	MinInterval time.Duration
	// Backoff is the wait before the second attempt, doubling after; 0 means
	// DefaultBackoff.
	Backoff time.Duration
	// Logger receives one line per operation; nil discards them. Lines name the
	// BMC and never carry its credentials.
	Logger *slog.Logger

	mu    sync.Mutex
	hosts map[string]*hostQueue
}

var _ bmc.Driver = (*Driver)(nil)

// hostQueue serializes and paces the operations on one BMC.
type hostQueue struct {
	turn chan struct{} // holds a token while an operation runs
	last time.Time     // when the last operation ended; guarded by turn
}

func (d *Driver) queue(addr string) *hostQueue {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hosts == nil {
		d.hosts = map[string]*hostQueue{}
	}
	q, ok := d.hosts[addr]
	if !ok {
		q = &hostQueue{turn: make(chan struct{}, 1)}
		d.hosts[addr] = q
	}
	return q
}

// wait takes the BMC's turn, paced by MinInterval; release gives it back.
func (d *Driver) wait(ctx context.Context, h bmc.Host) (release func(), err error) {
	q := d.queue(h.Addr())
	select {
	case q.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, bmc.Errorf(bmc.KindUnreachable, "%s: gave up waiting for the previous operation on this BMC: %w", h, ctx.Err())
	}
	if pause := time.Until(q.last.Add(d.minInterval())); pause > 0 {
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			<-q.turn
			return nil, bmc.Errorf(bmc.KindUnreachable, "%s: %w", h, ctx.Err())
		}
	}
	return func() {
		q.last = time.Now()
		<-q.turn
	}, nil
}

func (d *Driver) minInterval() time.Duration {
	switch {
	case d.MinInterval < 0:
		return 0
	case d.MinInterval == 0:
		return DefaultMinInterval
	}
	return d.MinInterval
}

func (d *Driver) timeout() time.Duration {
	if d.Timeout <= 0 {
		return DefaultTimeout
	}
	return d.Timeout
}

func (d *Driver) retries() int {
	switch {
	case d.Retries < 0:
		return 0
	case d.Retries == 0:
		return DefaultRetries
	}
	return d.Retries
}

func (d *Driver) attempts() int {
	if d.Attempts <= 0 {
		return DefaultAttempts
	}
	return d.Attempts
}

func (d *Driver) backoff() time.Duration {
	if d.Backoff <= 0 {
		return DefaultBackoff
	}
	return d.Backoff
}

func (d *Driver) log() *slog.Logger {
	if d.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Logger
}

// connect opens an RMCP+ session as an administrator.
func (d *Driver) connect(ctx context.Context, h bmc.Host) (*client.Client, error) {
	if err := validHost(h); err != nil {
		return nil, err
	}
	port := h.Port
	if port == 0 {
		port = bmc.DefaultPort
	}
	c, err := client.NewClient(h.Address, port, h.Username, string(h.Password))
	if err != nil {
		return nil, bmc.Errorf(bmc.KindInvalid, "%s: %v", h, err)
	}
	c.WithTimeout(d.timeout()).WithRetry(d.retries()).WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)
	if h.CipherSuite != 0 {
		c.WithCipherSuiteID(types.CipherSuiteID(h.CipherSuite))
	}
	if err := c.Connect(ctx); err != nil {
		return nil, classify(ctx, h, "open a session", err)
	}
	return c, nil
}

func validHost(h bmc.Host) error {
	switch {
	case h.Address == "":
		return bmc.Errorf(bmc.KindInvalid, "%s: no address", h)
	case h.Port < 0 || h.Port > 65535:
		return bmc.Errorf(bmc.KindInvalid, "%s: port %d is out of range", h, h.Port)
	case h.Username == "":
		return bmc.Errorf(bmc.KindInvalid, "%s: no username", h)
	case h.CipherSuite != 0 && h.CipherSuite != 3 && h.CipherSuite != 17:
		return bmc.Errorf(bmc.KindInvalid, "%s: cipher suite %d is not supported (3 or 17, or 0 to choose)", h, h.CipherSuite)
	}
	return nil
}

// do runs one operation in a session of its own, taking the BMC's turn first.
func (d *Driver) do(ctx context.Context, h bmc.Host, op string, idempotent bool, fn func(context.Context, *client.Client) error) error {
	start := time.Now()
	release, err := d.wait(ctx, h)
	if err != nil {
		return err
	}
	defer release()
	var last error
	backoff := d.backoff()
	for attempt := 1; attempt <= d.attempts(); attempt++ {
		if attempt > 1 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return last
			}
			backoff *= 2
		}
		c, err := d.connect(ctx, h)
		if err != nil {
			last = err
			if bmc.KindOf(err) != bmc.KindUnreachable || ctx.Err() != nil {
				// A refused login is not retried: BMCs lock users out.
				break
			}
			d.log().Warn("bmc did not answer", "bmc", h, "op", op, "attempt", attempt, "error", err)
			continue
		}
		err = fn(ctx, c)
		d.close(ctx, c)
		if err == nil {
			d.log().Info("bmc operation", "bmc", h, "op", op, "attempts", attempt, "duration", time.Since(start).Round(time.Millisecond))
			return nil
		}
		last = classify(ctx, h, op, err)
		if !idempotent && bmc.KindOf(last) == bmc.KindUnreachable {
			return bmc.Errorf(bmc.KindUnreachable, "%v (not resent: whether the BMC carried out %s is unknown)", last, op)
		}
		if bmc.KindOf(last) != bmc.KindUnreachable || ctx.Err() != nil {
			break
		}
	}
	d.log().Warn("bmc operation failed", "bmc", h, "op", op, "duration", time.Since(start).Round(time.Millisecond), "error", last)
	return last
}

// close ends the session, so it does not linger on the BMC until it times out.
func (d *Driver) close(ctx context.Context, c *client.Client) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.timeout())
	defer cancel()
	if err := c.Close(ctx); err != nil {
		d.log().Debug("close bmc session", "error", err)
	}
}

// classify gives an IPMI error its bmc.Kind and a message that names the BMC and
// the operation (and never a credential: the library's messages hold none).
func classify(ctx context.Context, h bmc.Host, op string, err error) error {
	msg := oneLine(err.Error())
	var respErr *types.ResponseError
	var netErr net.Error
	switch {
	case errors.Is(err, client.ErrRAKPAuthentication) || authRefused(msg):
		return &bmc.Error{Kind: bmc.KindAuth, Msg: fmt.Sprintf("%s: %s: the BMC refused the login of user %q (wrong password or user name)", h, op, h.Username), Err: err}
	case errors.As(err, &respErr) && respErr.CompletionCode() == types.CodeInsufficientPrivilege:
		return &bmc.Error{Kind: bmc.KindAuth, Msg: fmt.Sprintf("%s: %s: user %q lacks the privilege", h, op, h.Username), Err: err}
	case errors.As(err, &respErr):
		return &bmc.Error{Kind: bmc.KindBMC, Msg: fmt.Sprintf("%s: %s: the BMC answered %s", h, op, msg), Err: err}
	case ctx.Err() != nil:
		return &bmc.Error{Kind: bmc.KindUnreachable, Msg: fmt.Sprintf("%s: %s: no answer before the deadline (%v)", h, op, ctx.Err()), Err: err}
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), strings.Contains(msg, "timeout"), strings.Contains(msg, "no datagram matched"):
		return &bmc.Error{Kind: bmc.KindUnreachable, Msg: fmt.Sprintf("%s: %s: no answer from the BMC: %s", h, op, msg), Err: err}
	}
	return &bmc.Error{Kind: bmc.KindBMC, Msg: fmt.Sprintf("%s: %s: %s", h, op, msg), Err: err}
}

// authRefused recognizes the RMCP+ status codes of a refused login, which the
// library reports as text.
func authRefused(msg string) bool {
	m := strings.ToLower(msg)
	for _, s := range []string{"unauthorized name", "invalid integrity check", "unauthorized role", "invalid name length", "authentication code mismatch", "insufficient resources for role"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// PowerStatus implements bmc.Driver.
func (d *Driver) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	var on bool
	err := d.do(ctx, h, "power status", true, func(ctx context.Context, c *client.Client) error {
		var err error
		on, err = powerIsOn(ctx, c)
		return err
	})
	if err != nil {
		return "", err
	}
	return state(on), nil
}

func state(on bool) bmc.PowerState {
	if on {
		return bmc.PowerOn
	}
	return bmc.PowerOff
}

func powerIsOn(ctx context.Context, c *client.Client) (bool, error) {
	st, err := c.GetChassisStatus(ctx)
	if err != nil {
		return false, err
	}
	return st.PowerIsOn, nil
}

func control(ctx context.Context, c *client.Client, ctl chassis.ChassisControl) error {
	_, err := c.ChassisControl(ctx, ctl)
	return err
}

// PowerOn implements bmc.Driver.
func (d *Driver) PowerOn(ctx context.Context, h bmc.Host) error {
	return d.do(ctx, h, "power on", true, func(ctx context.Context, c *client.Client) error {
		return control(ctx, c, chassis.ChassisControlPowerUp)
	})
}

// PowerOff implements bmc.Driver.
func (d *Driver) PowerOff(ctx context.Context, h bmc.Host) error {
	return d.do(ctx, h, "power off", true, func(ctx context.Context, c *client.Client) error {
		return control(ctx, c, chassis.ChassisControlPowerDown)
	})
}

// PowerCycle implements bmc.Driver. Many BMCs refuse a cycle of a machine that is
// off, so that one is powered up instead.
func (d *Driver) PowerCycle(ctx context.Context, h bmc.Host) error {
	return d.do(ctx, h, "power cycle", false, func(ctx context.Context, c *client.Client) error {
		on, err := powerIsOn(ctx, c)
		if err != nil {
			return err
		}
		if !on {
			return control(ctx, c, chassis.ChassisControlPowerUp)
		}
		return control(ctx, c, chassis.ChassisControlPowerCycle)
	})
}

// PowerReset implements bmc.Driver; a machine that is off is powered up.
func (d *Driver) PowerReset(ctx context.Context, h bmc.Host) error {
	return d.do(ctx, h, "power reset", false, func(ctx context.Context, c *client.Client) error {
		on, err := powerIsOn(ctx, c)
		if err != nil {
			return err
		}
		if !on {
			return control(ctx, c, chassis.ChassisControlPowerUp)
		}
		return control(ctx, c, chassis.ChassisControlHardReset)
	})
}

// SetBootDevice implements bmc.Driver.
func (d *Driver) SetBootDevice(ctx context.Context, h bmc.Host, dev bmc.BootDevice) error {
	if err := dev.Validate(); err != nil {
		return err
	}
	selector := types.BootDeviceSelectorForcePXE
	if dev.Device == bmc.DeviceDisk {
		selector = types.BootDeviceSelectorForceHardDrive
	}
	bootType := types.BIOSBootTypeLegacy
	if dev.EFI {
		bootType = types.BIOSBootTypeEFI
	}
	op := "set boot device " + dev.Device
	return d.do(ctx, h, op, true, func(ctx context.Context, c *client.Client) error {
		return c.SetBootDevice(ctx, selector, bootType, dev.Persistent)
	})
}

// Inventory implements bmc.Driver. FRU data is optional: a BMC without any still
// has an inventory.
func (d *Driver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	var inv bmc.Inventory
	err := d.do(ctx, h, "inventory", true, func(ctx context.Context, c *client.Client) error {
		inv = bmc.Inventory{}
		id, err := c.GetDeviceID(ctx)
		if err != nil {
			return err
		}
		inv.ManufacturerID = id.ManufacturerID
		inv.ProductID = id.ProductID
		inv.FirmwareRevision = fmt.Sprintf("%d.%02x", id.MajorFirmwareRevision, id.MinorFirmwareRevision)
		inv.IPMIVersion = strconv.Itoa(int(id.MajorIPMIVersion)) + "." + strconv.Itoa(int(id.MinorIPMIVersion))
		on, err := powerIsOn(ctx, c)
		if err != nil {
			return err
		}
		inv.Power = state(on)
		if g, err := c.GetSystemGUID(ctx); err == nil {
			if u, err := types.ParseGUID(g.GUID[:], types.GUIDModeIPMI); err == nil {
				inv.SystemGUID = u.String()
			}
		}
		if fru, err := c.GetFRU(ctx, 0, "builtin"); err == nil && fru.Present() {
			if b := fru.BoardInfoArea; b != nil {
				inv.BoardVendor = types.FRUFieldString(b.ManufacturerTypeLength, b.Manufacturer)
				inv.BoardProduct = types.FRUFieldString(b.ProductNameTypeLength, b.ProductName)
				inv.BoardSerial = types.FRUFieldString(b.SerialNumberTypeLength, b.SerialNumber)
			}
			if p := fru.ProductInfoArea; p != nil {
				inv.ProductVendor = types.FRUFieldString(p.ManufacturerTypeLength, p.Manufacturer)
				inv.ProductName = types.FRUFieldString(p.NameTypeLength, p.Name)
				inv.ProductSerial = types.FRUFieldString(p.SerialNumberTypeLength, p.SerialNumber)
			}
			if ch := fru.ChassisInfoArea; ch != nil {
				inv.ChassisSerial = types.FRUFieldString(ch.SerialNumberTypeLength, ch.SerialNumber)
			}
		}
		return nil
	})
	return inv, err
}
