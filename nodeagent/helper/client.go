package helper

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/protocol"
)

// DefaultTimeout bounds one operation; update.swap copies up to 512 MiB and
// fsyncs it, so it has SwapTimeout.
const (
	DefaultTimeout = 30 * time.Second
	SwapTimeout    = 5 * time.Minute
	// reconnectFor is how long a call retries a helper that is not
	// listening (restarting: Restart=always, RestartSec=2s).
	reconnectFor = 10 * time.Second
)

// Client is bcd node's side of the helper socket. Safe for concurrent use.
type Client struct {
	// Socket is [helper] socket.
	Socket string
	hc     *http.Client
}

// NewClient is a client of the helper at [helper] socket.
func NewClient(h *config.Helper) *Client {
	sock := config.DefaultHelperSocket
	if h != nil && h.Socket != "" {
		sock = h.Socket
	}
	return NewClientAt(sock)
}

// NewClientAt is a client of the helper listening at socket.
func NewClientAt(socket string) *Client {
	c := &Client{Socket: socket}
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Socket)
		},
		DisableKeepAlives: true, // each call is checked on its own connection's peer
	}}
	return c
}

// call posts req to op and decodes the answer into resp (nil: discard).
func (c *Client) call(ctx context.Context, op string, timeout time.Duration, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	giveUp := time.Now().Add(reconnectFor)
	for {
		err = c.once(ctx, op, body, resp)
		if !notListening(err) || time.Now().After(giveUp) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if notListening(err) {
		return &Error{Code: CodeUnavailable, Message: fmt.Sprintf("no bcd helper at %s (is bcd-helper.service running?): %v", c.Socket, err)}
	}
	return err
}

func (c *Client) once(ctx context.Context, op string, body []byte, resp any) error {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://bcd-helper"+PathPrefix+op, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := c.hc.Do(r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, MaxRequest+1))
	if err != nil {
		return fmt.Errorf("bcd helper: %s: %w", op, err)
	}
	if res.StatusCode != http.StatusOK {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Code == "" {
			return fmt.Errorf("bcd helper: %s: HTTP %s", op, res.Status)
		}
		if e.Refusal {
			return &selfupdate.Refusal{Code: e.Code, Message: e.Message, Err: &e}
		}
		return &e
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(data, resp); err != nil {
		return fmt.Errorf("bcd helper: %s: the answer does not decode: %w", op, err)
	}
	return nil
}

func notListening(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// Reboot asks the helper to reboot the machine. On success the machine goes
// down; the call may return an error as the connection drops.
func (c *Client) Reboot(ctx context.Context) error {
	return c.call(ctx, OpReboot, DefaultTimeout, Empty{}, nil)
}

// UpdateResume is selfupdate.Manager.Resume for the node running version running.
func (c *Client) UpdateResume(ctx context.Context, running string) (selfupdate.Outcome, error) {
	var r OutcomeResponse
	err := c.call(ctx, OpUpdateResume, DefaultTimeout, UpdateRequest{Running: running}, &r)
	return r.Outcome, err
}

// UpdateVerify is selfupdate.Manager.Verify under the helper's pins and floor.
func (c *Client) UpdateVerify(ctx context.Context, running string, sec protocol.DaemonSection, serverNow time.Time) (*selfupdate.Plan, error) {
	var r PlanResponse
	err := c.call(ctx, OpUpdateVerify, DefaultTimeout, UpdateRequest{Running: running, Section: &sec, ServerTime: serverNow}, &r)
	return r.Plan, err
}

// UpdateSwap has the helper verify sec again, install the staged binary and swap.
func (c *Client) UpdateSwap(ctx context.Context, running string, sec protocol.DaemonSection, serverNow time.Time, commandID string, revision int64) error {
	return c.call(ctx, OpUpdateSwap, SwapTimeout, UpdateRequest{Running: running, Section: &sec, ServerTime: serverNow, CommandID: commandID, Revision: revision}, nil)
}

// UpdateConfirm is selfupdate.Manager.Confirm for the node running version running.
func (c *Client) UpdateConfirm(ctx context.Context, running string) (selfupdate.Outcome, error) {
	var r OutcomeResponse
	err := c.call(ctx, OpUpdateConfirm, DefaultTimeout, UpdateRequest{Running: running}, &r)
	return r.Outcome, err
}

// UpdateSwapBack is selfupdate.Manager.SwapBack.
func (c *Client) UpdateSwapBack(ctx context.Context, running, why string) error {
	return c.call(ctx, OpUpdateSwapBack, DefaultTimeout, UpdateRequest{Running: running, Why: why}, nil)
}

// TPMCreate makes a node key in the host's TPM; an *Error with CodeNoTPM when
// there is none.
func (c *Client) TPMCreate(ctx context.Context) (TPMKeyResponse, error) {
	var r TPMKeyResponse
	err := c.call(ctx, OpTPMCreate, DefaultTimeout, Empty{}, &r)
	return r, err
}

// TPMLoad checks that the TPM takes record and returns its public key (PKIX DER).
func (c *Client) TPMLoad(ctx context.Context, record []byte) ([]byte, error) {
	var r TPMKeyResponse
	err := c.call(ctx, OpTPMLoad, DefaultTimeout, TPMKeyRequest{Record: record}, &r)
	return r.PublicKey, err
}

// TPMSign signs digest (of hash h) with record's key.
func (c *Client) TPMSign(ctx context.Context, record, digest []byte, h crypto.Hash) ([]byte, error) {
	var r TPMSignResponse
	err := c.call(ctx, OpTPMSign, DefaultTimeout, TPMSignRequest{Record: record, Digest: digest, Hash: h.String()}, &r)
	return r.Signature, err
}

// IsHelperError reports whether err carries a helper Error: bcd helper (or
// the client, for HELPER_UNAVAILABLE) answered, rather than the node's own
// files failing.
func IsHelperError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// IsCode reports whether err is a helper Error with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Call posts req (any JSON value, such as a json.RawMessage) to op and
// decodes the answer into resp: bcd helper call's diagnostic use of the
// socket. The node itself uses the typed methods.
func (c *Client) Call(ctx context.Context, op string, req, resp any) error {
	timeout := DefaultTimeout
	if op == OpUpdateSwap {
		timeout = SwapTimeout
	}
	return c.call(ctx, op, timeout, req, resp)
}
