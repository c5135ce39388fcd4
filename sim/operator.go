package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/agent"
)

// operator is the little of better-compute's operator API that sim needs: add a
// machine, deploy it, list machines, read a machine's events. bcd links no
// control-plane code (internal/guard), so the wire shapes are restated here, only
// with the fields sim reads or sends.
type operator struct {
	base  string // https://host:port/api/v1
	token string
	hc    *http.Client
}

func newOperator(api, token, servingCAPin string) (*operator, error) {
	u, err := url.Parse(api)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("--api %q: want https://host:port of better-compute serve's api", api)
	}
	tc, err := agent.PinnedTLSConfig(servingCAPin, u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("the api's TLS: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	return &operator{base: strings.TrimSuffix(api, "/") + strings.TrimSuffix(u.Path, "/") + "/api/v1", token: token,
		hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}, nil
}

// APIError is an answer of the api other than 2xx.
type APIError struct {
	Status int
	Body   string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("api: %d %s", e.Status, strings.TrimSpace(e.Body))
}

// operatorRetry bounds how long a call waits for serve to come back: a faults run
// restarts serve while sim may still be registering machines, and an operator's
// tool would retry what serve never took.
const operatorRetry = time.Minute

// do calls the api, again while serve refuses the connection (nothing was sent) or
// answers 503 (nothing was done), for up to operatorRetry.
func (o *operator) do(ctx context.Context, method, path string, in, out any) error {
	deadline := time.Now().Add(operatorRetry)
	for {
		err := o.once(ctx, method, path, in, out)
		var ae *APIError
		retry := errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable
		if !retry || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (o *operator) once(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, o.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := o.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Status: resp.StatusCode, Body: string(b)}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type apiBMC struct {
	Address     string  `json:"address"`
	Port        int     `json:"port,omitempty"`
	Username    string  `json:"username"`
	Password    *string `json:"password,omitempty"`
	CipherSuite int     `json:"cipher_suite,omitempty"`
}

type apiMachineCreate struct {
	Site     string   `json:"site"`
	Name     string   `json:"name,omitempty"`
	MACs     []string `json:"macs"`
	BMC      *apiBMC  `json:"bmc,omitempty"`
	Firmware string   `json:"firmware,omitempty"`
}

type apiImage struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Format string `json:"format,omitempty"`
}

type apiDeploy struct {
	Image apiImage `json:"image"`
	After string   `json:"after,omitempty"`
}

// apiMachine is what sim reads of a machine.
type apiMachine struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	State       string    `json:"state"`
	StateReason string    `json:"state_reason"`
	ChangedAt   time.Time `json:"state_changed_at"`
	Node        string    `json:"node"`
}

type apiEvent struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

func (o *operator) addMachine(ctx context.Context, in apiMachineCreate) error {
	return o.do(ctx, http.MethodPost, "/machines", in, nil)
}

func (o *operator) deleteMachine(ctx context.Context, name string) error {
	return o.do(ctx, http.MethodDelete, "/machines/"+url.PathEscape(name)+"?yes=true", nil, nil)
}

func (o *operator) deploy(ctx context.Context, name string, d apiDeploy) error {
	return o.do(ctx, http.MethodPost, "/machines/"+url.PathEscape(name)+"/deploy", d, nil)
}

func (o *operator) machines(ctx context.Context) ([]apiMachine, error) {
	var v struct {
		Machines []apiMachine `json:"machines"`
	}
	err := o.do(ctx, http.MethodGet, "/machines", nil, &v)
	return v.Machines, err
}

func (o *operator) events(ctx context.Context, name string) ([]apiEvent, error) {
	var v struct {
		Events []apiEvent `json:"events"`
	}
	err := o.do(ctx, http.MethodGet, "/machines/"+url.PathEscape(name)+"/events", nil, &v)
	return v.Events, err
}
