// Package sealed is the store wrapper that keeps secrets out of the
// database: it seals every store.SecretField on its way in (AES-256-GCM
// under the keyring pki.SecretsKeyFile beside the PKI bundle) and opens it on
// its way out, so the rest of the control plane, and the agents a command is
// delivered to, see plaintext while the database file, its WAL and any backup
// of them hold none.
//
// What is sealed: a machine's BMC password; a command's params, whole (a
// deploy.image's join token and image URL); a deployment's image URL when it
// carries userinfo, a query or a fragment (a presigned URL's signature), and
// an image catalog entry's URL on the same rule. A
// sealed value is "sealed:v1:<key id>:<base64>" (command params as that JSON
// string), so a plaintext value left by an older database is told apart and
// resealed by RewriteSecrets, which serve runs at every start. The store
// implementations know nothing of it; this wrapper is the one owner.
package sealed

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Store is a store.Store whose secret fields are sealed at rest.
type Store struct {
	store.Store
	k *pki.Keyring
}

// Wrap seals s's secret fields under k. s must implement
// store.SecretRewriter.
func Wrap(s store.Store, k *pki.Keyring) (*Store, error) {
	if _, ok := s.(store.SecretRewriter); !ok {
		return nil, fmt.Errorf("sealed: the store %T cannot reseal its secrets", s)
	}
	return &Store{Store: s, k: k}, nil
}

// Keyring is the keyring the store seals under.
func (s *Store) Keyring() *pki.Keyring { return s.k }

// RewriteSecrets seals every plaintext secret the database holds and
// reseals those sealed under a key other than the keyring's primary, in one
// transaction, and reports how many values it changed.
func (s *Store) RewriteSecrets(ctx context.Context) (int, error) {
	n, err := s.Store.(store.SecretRewriter).RewriteSecrets(ctx, s.reseal)
	if err != nil {
		return 0, fmt.Errorf("sealed: %w", err)
	}
	return n, nil
}

// Rotate makes a new primary key, reseals every stored secret under it, and
// only once that committed retires the old keys. A crash at any point leaves
// a keyring that opens every stored value (both keys until the retire), and
// running Rotate again finishes the job.
func (s *Store) Rotate(ctx context.Context) (string, int, error) {
	kid, err := s.k.Rotate()
	if err != nil {
		return "", 0, fmt.Errorf("sealed: rotate: %w", err)
	}
	n, err := s.RewriteSecrets(ctx)
	if err != nil {
		return "", 0, err
	}
	if err := afterReseal(); err != nil {
		return "", 0, err
	}
	if err := s.k.Retire(); err != nil {
		return "", 0, fmt.Errorf("sealed: retire the old keys: %w", err)
	}
	return kid, n, nil
}

// afterReseal is a test's crash point between the reseal and the retire.
var afterReseal = func() error { return nil }

// reseal is RewriteSecrets's function over stored values.
func (s *Store) reseal(f store.SecretField, v string) (string, error) {
	switch f {
	case store.SecretBMCPassword:
		return s.resealString(string(f), v)
	case store.SecretCommandParams:
		var str string
		if json.Unmarshal([]byte(v), &str) == nil {
			if _, ok := pki.Sealed(str); ok {
				if !s.k.NeedsReseal(str) {
					return v, nil
				}
				pt, err := s.k.Open(string(f), str)
				if err != nil {
					return "", err
				}
				v = pt
			}
		}
		out, err := s.sealParams(json.RawMessage(v))
		return string(out), err
	case store.SecretDeploySpec:
		var spec store.DeploySpec
		if err := json.Unmarshal([]byte(v), &spec); err != nil {
			return "", fmt.Errorf("a stored deploy spec: %w", err)
		}
		if spec.Image.URL == "" || !s.k.NeedsReseal(spec.Image.URL) || !needsSeal(spec.Image.URL) {
			return v, nil
		}
		u, err := s.open(labelImageURL, spec.Image.URL)
		if err != nil {
			return "", err
		}
		if spec.Image.URL, err = s.sealURL(u); err != nil {
			return "", err
		}
		b, err := json.Marshal(spec)
		return string(b), err
	case store.SecretImageURL:
		if !needsSeal(v) || !s.k.NeedsReseal(v) {
			return v, nil
		}
		u, err := s.open(labelImageURL, v)
		if err != nil {
			return "", err
		}
		return s.sealURL(u)
	}
	return "", fmt.Errorf("unknown secret field %q", f)
}

const labelImageURL = "image url"

// resealString seals a plaintext value and reseals one under an old key.
func (s *Store) resealString(label, v string) (string, error) {
	if !s.k.NeedsReseal(v) {
		return v, nil
	}
	pt, err := s.open(label, v)
	if err != nil {
		return "", err
	}
	return s.k.Seal(label, pt)
}

// open opens a sealed value and passes plaintext (an older database's) through.
func (s *Store) open(label, v string) (string, error) {
	if _, ok := pki.Sealed(v); !ok {
		return v, nil
	}
	return s.k.Open(label, v)
}

// needsSeal reports whether an image URL carries what may be a credential:
// whatever protocol.RedactURL would drop.
func needsSeal(u string) bool {
	if _, ok := pki.Sealed(u); ok {
		return true
	}
	return protocol.RedactURL(u) != u
}

func (s *Store) sealURL(u string) (string, error) {
	if !needsSeal(u) {
		return u, nil
	}
	return s.k.Seal(labelImageURL, u)
}

// sealParams seals a command's params whole, as a JSON string.
func (s *Store) sealParams(p json.RawMessage) (json.RawMessage, error) {
	if len(p) == 0 {
		return p, nil
	}
	sv, err := s.k.Seal(string(store.SecretCommandParams), string(p))
	if err != nil {
		return nil, err
	}
	return json.Marshal(sv)
}

// openParams opens what sealParams made; params stored before sealing pass.
func (s *Store) openParams(p json.RawMessage) (json.RawMessage, error) {
	var str string
	if len(p) == 0 || p[0] != '"' || json.Unmarshal(p, &str) != nil {
		return p, nil
	}
	if _, ok := pki.Sealed(str); !ok {
		return p, nil
	}
	pt, err := s.k.Open(string(store.SecretCommandParams), str)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(pt), nil
}

func (s *Store) sealBMC(b *store.MachineBMC) (*store.MachineBMC, error) {
	if b == nil || b.Password == "" {
		return b, nil
	}
	c := *b
	var err error
	c.Password, err = s.k.Seal(string(store.SecretBMCPassword), b.Password)
	return &c, err
}

func (s *Store) openMachine(m store.Machine, err error) (store.Machine, error) {
	if err != nil || m.BMC == nil {
		return m, err
	}
	c := *m.BMC
	if c.Password, err = s.open(string(store.SecretBMCPassword), c.Password); err != nil {
		return store.Machine{}, fmt.Errorf("sealed: machine %s: %w", m.ID, err)
	}
	m.BMC = &c
	return m, nil
}

func (s *Store) openMachines(ms []store.Machine, err error) ([]store.Machine, error) {
	if err != nil {
		return nil, err
	}
	for i := range ms {
		if ms[i], err = s.openMachine(ms[i], nil); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

func (s *Store) sealCommand(c store.Command) (store.Command, error) {
	var err error
	c.Params, err = s.sealParams(c.Params)
	return c, err
}

func (s *Store) sealCommands(cs []store.Command) ([]store.Command, error) {
	if len(cs) == 0 {
		return cs, nil
	}
	out := make([]store.Command, len(cs))
	for i, c := range cs {
		var err error
		if out[i], err = s.sealCommand(c); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) openCommand(c store.Command, err error) (store.Command, error) {
	if err != nil {
		return c, err
	}
	if c.Params, err = s.openParams(c.Params); err != nil {
		return store.Command{}, fmt.Errorf("sealed: command %s: %w", c.ID, err)
	}
	return c, nil
}

func (s *Store) sealDeployment(d store.Deployment) (store.Deployment, error) {
	var err error
	d.Spec.Image.URL, err = s.sealURL(d.Spec.Image.URL)
	return d, err
}

func (s *Store) openDeployment(d store.Deployment, err error) (store.Deployment, error) {
	if err != nil {
		return d, err
	}
	if d.Spec.Image.URL, err = s.open(labelImageURL, d.Spec.Image.URL); err != nil {
		return store.Deployment{}, fmt.Errorf("sealed: deployment %s: %w", d.ID, err)
	}
	return d, nil
}

func (s *Store) sealChange(ch store.DeploymentChange) (store.DeploymentChange, error) {
	var err error
	ch.Commands, err = s.sealCommands(ch.Commands)
	return ch, err
}

// The methods below are every store method whose arguments or results hold
// a store.SecretField (TestEverySecretMethodIsSealed keeps the list whole).

func (s *Store) CreateMachine(ctx context.Context, m store.Machine) error {
	var err error
	if m.BMC, err = s.sealBMC(m.BMC); err != nil {
		return err
	}
	return s.Store.CreateMachine(ctx, m)
}

func (s *Store) GetMachine(ctx context.Context, id string) (store.Machine, error) {
	return s.openMachine(s.Store.GetMachine(ctx, id))
}

func (s *Store) FindMachineByMAC(ctx context.Context, mac string) (store.Machine, error) {
	return s.openMachine(s.Store.FindMachineByMAC(ctx, mac))
}

func (s *Store) FindMachinesByName(ctx context.Context, name string) ([]store.Machine, error) {
	return s.openMachines(s.Store.FindMachinesByName(ctx, name))
}

func (s *Store) ListMachines(ctx context.Context, site string) ([]store.Machine, error) {
	return s.openMachines(s.Store.ListMachines(ctx, site))
}

func (s *Store) UpdateMachine(ctx context.Context, id string, u store.MachineUpdate) (store.Machine, error) {
	var err error
	if u.BMC, err = s.sealBMC(u.BMC); err != nil {
		return store.Machine{}, err
	}
	return s.openMachine(s.Store.UpdateMachine(ctx, id, u))
}

func (s *Store) AdoptBindings(ctx context.Context, id string, ch store.StatusChange) (store.Machine, error) {
	return s.openMachine(s.Store.AdoptBindings(ctx, id, ch))
}

func (s *Store) FindMachineByNode(ctx context.Context, nodeID string) (store.Machine, error) {
	return s.openMachine(s.Store.FindMachineByNode(ctx, nodeID))
}

func (s *Store) ListMachinesInState(ctx context.Context, state string) ([]store.Machine, error) {
	return s.openMachines(s.Store.ListMachinesInState(ctx, state))
}

func (s *Store) ListMachinesWithPendingBindings(ctx context.Context) ([]store.Machine, error) {
	return s.openMachines(s.Store.ListMachinesWithPendingBindings(ctx))
}

func (s *Store) CreateCommand(ctx context.Context, c store.Command) error {
	c, err := s.sealCommand(c)
	if err != nil {
		return err
	}
	return s.Store.CreateCommand(ctx, c)
}

func (s *Store) GetCommand(ctx context.Context, id string) (store.Command, error) {
	return s.openCommand(s.Store.GetCommand(ctx, id))
}

func (s *Store) OpenCommands(ctx context.Context, nodeID string) ([]store.Command, error) {
	cs, err := s.Store.OpenCommands(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	for i := range cs {
		if cs[i], err = s.openCommand(cs[i], nil); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

func (s *Store) StartDeployment(ctx context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	d, err := s.sealDeployment(d)
	if err != nil {
		return store.Deployment{}, err
	}
	if ch, err = s.sealChange(ch); err != nil {
		return store.Deployment{}, err
	}
	return s.openDeployment(s.Store.StartDeployment(ctx, d, ch))
}

func (s *Store) AdvanceDeployment(ctx context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	d, err := s.sealDeployment(d)
	if err != nil {
		return store.Deployment{}, err
	}
	if ch, err = s.sealChange(ch); err != nil {
		return store.Deployment{}, err
	}
	return s.openDeployment(s.Store.AdvanceDeployment(ctx, d, ch))
}

func (s *Store) GetDeployment(ctx context.Context, id string) (store.Deployment, error) {
	return s.openDeployment(s.Store.GetDeployment(ctx, id))
}

func (s *Store) OpenDeployments(ctx context.Context) ([]store.Deployment, error) {
	ds, err := s.Store.OpenDeployments(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ds {
		if ds[i], err = s.openDeployment(ds[i], nil); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

func (s *Store) StepRollout(ctx context.Context, st store.RolloutStep) error {
	var err error
	if st.Commands, err = s.sealCommands(st.Commands); err != nil {
		return err
	}
	return s.Store.StepRollout(ctx, st)
}

func (s *Store) openImage(im store.Image, err error) (store.Image, error) {
	if err != nil {
		return im, err
	}
	if im.Image.URL, err = s.open(labelImageURL, im.Image.URL); err != nil {
		return store.Image{}, fmt.Errorf("sealed: image %s: %w", im.Name, err)
	}
	return im, nil
}

func (s *Store) AddImage(ctx context.Context, im store.Image) error {
	var err error
	if im.Image.URL, err = s.sealURL(im.Image.URL); err != nil {
		return err
	}
	return s.Store.AddImage(ctx, im)
}

func (s *Store) GetImage(ctx context.Context, name string) (store.Image, error) {
	return s.openImage(s.Store.GetImage(ctx, name))
}

func (s *Store) ListImages(ctx context.Context) ([]store.Image, error) {
	ims, err := s.Store.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ims {
		if ims[i], err = s.openImage(ims[i], nil); err != nil {
			return nil, err
		}
	}
	return ims, nil
}
