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
	"github.com/better-compute/bcd/protocol"
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

// do calls the api, again while serve refuses the connection (nothing was sent),
// closes or resets it during the call (serve restarted: what was sent may or may
// not have been applied) or answers 503 (nothing was done), for up to
// operatorRetry.
func (o *operator) do(ctx context.Context, method, path string, in, out any) error {
	_, err := o.call(ctx, method, path, in, out)
	return err
}

// call is do, and also says whether an attempt lost its connection after the
// request may have reached serve: a resent POST may then meet what the lost
// attempt did.
func (o *operator) call(ctx context.Context, method, path string, in, out any) (lost bool, err error) {
	deadline := time.Now().Add(operatorRetry)
	for {
		err = o.once(ctx, method, path, in, out)
		var ae *APIError
		cut := connLost(err)
		lost = lost || cut
		retry := errors.Is(err, syscall.ECONNREFUSED) || cut || errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable
		if !retry || time.Now().After(deadline) || ctx.Err() != nil {
			return lost, err
		}
		select {
		case <-ctx.Done():
			return lost, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// connLost says err is a connection serve closed or reset while the call was
// out (EOF before the answer, ECONNRESET, EPIPE): serve stopped, maybe after it
// applied the request.
func connLost(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		// net/http's errServerClosedIdle, not exported: a reused connection
		// serve had closed.
		strings.Contains(err.Error(), "server closed idle connection")
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

// deploy starts machine name's deployment of d. When serve closed the connection
// of an attempt and the attempt resent is refused ALREADY_EXISTS, the deployment
// running may be the lost attempt's own: it is taken as this call's when the
// refusal names the machine's current deployment, that deployment is of d, and
// serve created it after this call began (ownDeployment).
// cancel stops machine ref's deployment.
func (o *operator) cancel(ctx context.Context, ref string) error {
	return o.do(ctx, http.MethodPost, "/machines/"+url.PathEscape(ref)+"/cancel", nil, nil)
}

func (o *operator) deploy(ctx context.Context, name string, d apiDeploy) error {
	began := time.Now()
	lost, err := o.call(ctx, http.MethodPost, "/machines/"+url.PathEscape(name)+"/deploy", d, nil)
	var ae *APIError
	if err == nil || !lost || !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		return err
	}
	if why := o.ownDeployment(ctx, name, d, ae, began); why != "" {
		return fmt.Errorf("%w (resent after serve closed the connection; the deployment running is not this call's: %s)", err, why)
	}
	return nil
}

// deployClockSkew is how much earlier than sim's clock serve's may stamp a
// deployment sim started.
const deployClockSkew = 30 * time.Second

// ownDeployment says why the deployment refusal ae is not of the deployment d
// that a lost attempt of this call started; "" when it is.
func (o *operator) ownDeployment(ctx context.Context, name string, d apiDeploy, ae *APIError, began time.Time) string {
	var refusal struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal([]byte(ae.Body), &refusal) != nil || refusal.Code != protocol.CodeAlreadyExists {
		return "the refusal is not ALREADY_EXISTS"
	}
	var m struct {
		Current *struct {
			ID   string `json:"id"`
			Spec struct {
				Image apiImage `json:"image"`
				After string   `json:"after"`
			} `json:"spec"`
			CreatedAt time.Time `json:"created_at"`
		} `json:"current_deployment"`
	}
	if err := o.do(ctx, http.MethodGet, "/machines/"+url.PathEscape(name), nil, &m); err != nil {
		return "reading the machine: " + err.Error()
	}
	cur := m.Current
	switch {
	case cur == nil || cur.ID == "":
		return "the machine shows no deployment"
	case !strings.Contains(refusal.Message, "deployment "+cur.ID):
		return fmt.Sprintf("the refusal does not name the machine's deployment %s", cur.ID)
	case cur.Spec.Image.SHA256 != d.Image.SHA256 || cur.Spec.Image.Size != d.Image.Size || cur.Spec.After != d.After:
		return fmt.Sprintf("deployment %s installs another image (sha256 %s, %d bytes, after %s)", cur.ID, cur.Spec.Image.SHA256, cur.Spec.Image.Size, cur.Spec.After)
	case cur.CreatedAt.Before(began.Add(-deployClockSkew)):
		return fmt.Sprintf("deployment %s was created at %s, before this call", cur.ID, cur.CreatedAt.Format(time.RFC3339))
	}
	return ""
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
