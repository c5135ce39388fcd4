package sealed

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/controlplane/store/storetest"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

// TestStoreContract: the wrapper keeps every guarantee of the store.
func TestStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _, _ := open(t)
		return s
	})
}

// open opens a sealed SQLite store in a temporary directory, returning it,
// the store beneath and the data directory.
func open(t *testing.T) (*Store, store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	k, err := pki.OpenKeyring(filepath.Join(dir, pki.SecretsKeyFile), true)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	inner, err := sqlite.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	s, err := Wrap(inner, k)
	if err != nil {
		t.Fatal(err)
	}
	return s, inner, data
}

// secretTypes are the records that hold a store.SecretField.
var secretTypes = []reflect.Type{reflect.TypeFor[store.MachineBMC](), reflect.TypeFor[store.Command](), reflect.TypeFor[store.DeploySpec](),
	reflect.TypeFor[store.Image]()}

// reaches reports whether a value of t can hold one of secretTypes.
func reaches(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if slices.Contains(secretTypes, t) {
		return true
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		return reaches(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if reaches(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// secretMethods are the store methods whose arguments or results can hold a
// secret.
func secretMethods() []string {
	st := reflect.TypeFor[store.Store]()
	var out []string
	for i := range st.NumMethod() {
		m := st.Method(i)
		ft := m.Type
		for j := range ft.NumIn() {
			if reaches(ft.In(j), map[reflect.Type]bool{}) {
				out = append(out, m.Name)
				goto next
			}
		}
		for j := range ft.NumOut() {
			if reaches(ft.Out(j), map[reflect.Type]bool{}) {
				out = append(out, m.Name)
				goto next
			}
		}
	next:
	}
	return out
}

// fixture is a store with a site, a machine with a BMC password bound to a
// ramdisk node (not adopted), and a deployment from a presigned URL whose
// deploy.image command carries a join token.
type fixture struct {
	s     *Store
	data  string
	m     store.Machine
	dep   store.Deployment
	cmd   store.Command
	now   time.Time
	nodes int
}

const (
	fxPassword = "fx-bmc-password-1"
	fxURL      = "https://fxuser:fxpass@img.test/os.raw?X-Amz-Signature=fxsignature00"
	fxToken    = "bcjt_fxtokensecret"
)

func fxParams(token, url string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"image": map[string]any{"url": url},
		"files": []map[string]any{{"path": "/etc/bcd/join-token", "content": base64.StdEncoding.EncodeToString([]byte(token + "\n"))}}})
	return b
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s, _, data := open(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	fx := &fixture{s: s, data: data, now: now}
	if err := s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	m := store.Machine{ID: "m_1", Site: "fsn1", MachineSpec: store.MachineSpec{Name: "r1", MACs: []string{"52:54:00:00:00:01"},
		BMC: &store.MachineBMC{Address: "10.0.0.1", Username: "root", Password: fxPassword}},
		MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: now}, CreatedAt: now, UpdatedAt: now}
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit(ctx, store.Admission{Node: store.Node{ID: "n_rd", Role: protocol.RoleRamdisk, Site: "fsn1", Pool: "default",
		SPIFFEID: "spiffe://x/ramdisk/n_rd", Claims: []byte(`{}`), CertSerial: "1", CertNotAfter: now.Add(time.Hour), State: "ready"}, Machine: m.ID, Inventory: json.RawMessage(`{}`), Now: now}); err != nil {
		t.Fatal(err)
	}
	d, err := s.StartDeployment(ctx, store.Deployment{ID: "dep_1", MachineID: m.ID, Step: "inventory",
		Spec: store.DeploySpec{Image: protocol.DeployImage{URL: fxURL, SHA256: strings.Repeat("a", 64), Size: 1}, After: "kexec", Pool: "default"}},
		store.DeploymentChange{State: store.MachineRamdisk, At: now})
	if err != nil {
		t.Fatal(err)
	}
	fx.cmd = store.Command{ID: "cmd_1", NodeID: "n_rd", MachineID: m.ID, Kind: protocol.KindDeployImage, Params: fxParams(fxToken, fxURL),
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	d.CommandID = fx.cmd.ID
	if fx.dep, err = s.AdvanceDeployment(ctx, d, store.DeploymentChange{State: store.MachineDeploying, Commands: []store.Command{fx.cmd}, At: now}); err != nil {
		t.Fatal(err)
	}
	if fx.m, err = s.Store.GetMachine(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.AddImage(ctx, store.Image{Name: "fx-os", Image: protocol.DeployImage{URL: fxURL, SHA256: strings.Repeat("a", 64), Size: 1},
		CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	return fx
}

// stored is every byte of the database and its WAL.
func (fx *fixture) stored(t *testing.T) []byte {
	t.Helper()
	var all []byte
	ents, err := os.ReadDir(fx.data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(fx.data, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// strs is every string and byte slice in v, joined.
func strs(v reflect.Value, b *strings.Builder) {
	switch v.Kind() {
	case reflect.String:
		b.WriteString(v.String() + "\n")
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b.Write(v.Bytes())
			b.WriteString("\n")
			return
		}
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			strs(v.Index(i), b)
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			strs(v.Elem(), b)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			strs(v.Field(i), b)
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			strs(it.Value(), b)
		}
	}
}

func show(v any) string {
	var b strings.Builder
	strs(reflect.ValueOf(v), &b)
	return b.String()
}

// TestEverySecretMethodIsSealed: each store method that takes a secret
// stores it sealed (the database file and WAL hold no plaintext), and each
// that returns one returns it open. The table must name every store method
// whose types reach a secret field, so a new one cannot pass the wrapper by.
func TestEverySecretMethodIsSealed(t *testing.T) {
	token64 := base64.StdEncoding.EncodeToString([]byte("bcjt_newtoken\n"))
	newSecrets := []string{"new-bmc-pw", "newuser:newpass", "newsignature", token64}
	// write: the method stores newSecrets' values; read: it returns what
	// the fixture holds (want, all of it).
	cases := map[string]struct {
		call func(t *testing.T, fx *fixture) (any, error)
		want []string
	}{
		"CreateMachine": {call: func(t *testing.T, fx *fixture) (any, error) {
			return nil, fx.s.CreateMachine(ctx, store.Machine{ID: "m_2", Site: "fsn1", MachineSpec: store.MachineSpec{MACs: []string{"52:54:00:00:00:02"},
				BMC: &store.MachineBMC{Address: "10.0.0.2", Username: "root", Password: "new-bmc-pw"}},
				MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: fx.now}, CreatedAt: fx.now, UpdatedAt: fx.now})
		}},
		"UpdateMachine": {call: func(t *testing.T, fx *fixture) (any, error) {
			return fx.s.UpdateMachine(ctx, fx.m.ID, store.MachineUpdate{SetBMC: true, BMC: &store.MachineBMC{Address: "10.0.0.9", Username: "root", Password: "new-bmc-pw"}, At: fx.now})
		}, want: []string{"new-bmc-pw"}},
		"GetMachine": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.GetMachine(ctx, fx.m.ID) },
			want: []string{fxPassword}},
		"FindMachineByMAC": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.FindMachineByMAC(ctx, fx.m.MACs[0]) },
			want: []string{fxPassword}},
		"FindMachinesByName": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.FindMachinesByName(ctx, "r1") },
			want: []string{fxPassword}},
		"ListMachines": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.ListMachines(ctx, "") },
			want: []string{fxPassword}},
		"AdoptBindings": {call: func(t *testing.T, fx *fixture) (any, error) {
			return fx.s.AdoptBindings(ctx, fx.m.ID, store.StatusChange{BindSeq: fx.m.BindSeq, RamdiskNode: "n_rd", At: fx.now})
		}, want: []string{fxPassword}},
		"FindMachineByNode": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.FindMachineByNode(ctx, "n_rd") },
			want: []string{fxPassword}},
		"ListMachinesInState": {call: func(t *testing.T, fx *fixture) (any, error) {
			return fx.s.ListMachinesInState(ctx, store.MachineDeploying)
		}, want: []string{fxPassword}},
		"ListMachinesWithPendingBindings": {call: func(t *testing.T, fx *fixture) (any, error) {
			return fx.s.ListMachinesWithPendingBindings(ctx)
		}, want: []string{fxPassword}},
		"CreateCommand": {call: func(t *testing.T, fx *fixture) (any, error) {
			return nil, fx.s.CreateCommand(ctx, store.Command{ID: "cmd_2", NodeID: "n_rd", Kind: protocol.KindDeployImage,
				Params: fxParams("bcjt_newtoken", "https://newuser:newpass@img.test/x?X-Amz-Signature=newsignature"), State: store.CommandPending, CreatedAt: fx.now, UpdatedAt: fx.now})
		}},
		"GetCommand": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.GetCommand(ctx, fx.cmd.ID) },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"OpenCommands": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.OpenCommands(ctx, "n_rd") },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"StartDeployment": {call: func(t *testing.T, fx *fixture) (any, error) {
			if err := fx.s.CreateMachine(ctx, store.Machine{ID: "m_3", Site: "fsn1", MachineSpec: store.MachineSpec{MACs: []string{"52:54:00:00:00:03"}},
				MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: fx.now}, CreatedAt: fx.now, UpdatedAt: fx.now}); err != nil {
				t.Fatal(err)
			}
			return fx.s.StartDeployment(ctx, store.Deployment{ID: "dep_3", MachineID: "m_3", Step: "bootdev",
				Spec: store.DeploySpec{Image: protocol.DeployImage{URL: "https://newuser:newpass@img.test/x?X-Amz-Signature=newsignature", SHA256: strings.Repeat("a", 64), Size: 1}, After: "kexec", Pool: "default"}},
				store.DeploymentChange{State: store.MachinePXEBooting, At: fx.now, Commands: []store.Command{{ID: "cmd_3", NodeID: "n_x", MachineID: "m_3",
					Kind: protocol.KindDeployImage, Params: fxParams("bcjt_newtoken", "https://x.test/"), State: store.CommandPending, CreatedAt: fx.now, UpdatedAt: fx.now}}})
		}, want: []string{"newuser:newpass", "newsignature"}},
		"AdvanceDeployment": {call: func(t *testing.T, fx *fixture) (any, error) {
			d := fx.dep
			d.Spec.Image.URL = "https://newuser:newpass@img.test/x?X-Amz-Signature=newsignature"
			return fx.s.AdvanceDeployment(ctx, d, store.DeploymentChange{At: fx.now, Commands: []store.Command{{ID: "cmd_4", NodeID: "n_rd", MachineID: fx.m.ID,
				Kind: protocol.KindDeployImage, Params: fxParams("bcjt_newtoken", "https://x.test/"), State: store.CommandPending, CreatedAt: fx.now, UpdatedAt: fx.now}}})
		}, want: []string{"newuser:newpass", "newsignature"}},
		"GetDeployment": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.GetDeployment(ctx, fx.dep.ID) },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"OpenDeployments": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.OpenDeployments(ctx) },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"AddImage": {call: func(t *testing.T, fx *fixture) (any, error) {
			return nil, fx.s.AddImage(ctx, store.Image{Name: "new-os", Image: protocol.DeployImage{
				URL: "https://newuser:newpass@img.test/x?X-Amz-Signature=newsignature", SHA256: strings.Repeat("a", 64), Size: 1}, CreatedAt: fx.now})
		}},
		"GetImage": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.GetImage(ctx, "fx-os") },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"ListImages": {call: func(t *testing.T, fx *fixture) (any, error) { return fx.s.ListImages(ctx) },
			want: []string{"fxsignature00", "fxuser:fxpass"}},
		"StepRollout": {call: func(t *testing.T, fx *fixture) (any, error) {
			r := store.Rollout{ID: "ro_1", Version: "0.1.1", Role: "node", Waves: []int{100}, MaxUnavailable: 1, WaveTimeout: time.Minute,
				State: store.RolloutRunning, CreatedAt: fx.now, UpdatedAt: fx.now}
			if err := fx.s.CreateRollout(ctx, r); err != nil {
				t.Fatal(err)
			}
			return nil, fx.s.StepRollout(ctx, store.RolloutStep{RolloutID: "ro_1", Revision: 1, State: store.RolloutRunning, At: fx.now,
				Commands: []store.Command{{ID: "cmd_5", NodeID: "n_rd", Kind: protocol.KindDaemonUpgrade,
					Params: fxParams("bcjt_newtoken", "https://newuser:newpass@img.test/x?X-Amz-Signature=newsignature"), State: store.CommandPending, CreatedAt: fx.now, UpdatedAt: fx.now}}})
		}},
	}
	var names []string
	for name := range cases {
		names = append(names, name)
	}
	slices.Sort(names)
	want := secretMethods()
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("the store methods that reach a secret are\n%v\nthe table covers\n%v", want, names)
	}
	for _, name := range names {
		c := cases[name]
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t)
			for _, v := range []string{fxPassword, "fxuser:fxpass", "fxsignature00", base64.StdEncoding.EncodeToString([]byte(fxToken + "\n"))} {
				if bytes.Contains(fx.stored(t), []byte(v)) {
					t.Fatalf("the fixture stored %q in the clear", v)
				}
			}
			got, err := c.call(t, fx)
			if err != nil {
				t.Fatal(err)
			}
			stored := fx.stored(t)
			for _, v := range newSecrets {
				if bytes.Contains(stored, []byte(v)) {
					t.Errorf("%s stored %q in the clear", name, v)
				}
			}
			out := show(got)
			if strings.Contains(out, pki.SealedPrefix) {
				t.Errorf("%s returned a sealed value: %s", name, out)
			}
			for _, v := range c.want {
				if !strings.Contains(out, v) {
					t.Errorf("%s returned no %q: %s", name, v, out)
				}
			}
		})
	}
}

// TestResealAfterRotation: a rotation reseals every stored secret under the
// new key and retires the old one; a crash between the reseal and the
// retire leaves a keyring that opens everything, and the next rotation
// finishes.
func TestResealAfterRotation(t *testing.T) {
	fx := newFixture(t)
	oldKey := fx.s.Keyring().Primary()
	crash := errors.New("crash")
	afterReseal = func() error { return crash }
	_, _, err := fx.s.Rotate(ctx)
	afterReseal = func() error { return nil }
	if !errors.Is(err, crash) {
		t.Fatalf("rotate with a crash: %v", err)
	}
	// What a restarted serve opens: the keyring file as the crash left it.
	k, err := pki.OpenKeyring(filepath.Join(filepath.Dir(fx.data), pki.SecretsKeyFile), false)
	if err != nil {
		t.Fatal(err)
	}
	if ids := k.KeyIDs(); len(ids) != 2 || !slices.Contains(ids, oldKey) || k.Primary() == oldKey {
		t.Fatalf("keyring after the crash: %v primary %s (old %s)", ids, k.Primary(), oldKey)
	}
	s, err := Wrap(fx.s.Store, k)
	if err != nil {
		t.Fatal(err)
	}
	check := func(s *Store) {
		t.Helper()
		m, err := s.GetMachine(ctx, fx.m.ID)
		if err != nil || m.BMC.Password != fxPassword {
			t.Fatalf("machine: %v", err)
		}
		c, err := s.GetCommand(ctx, fx.cmd.ID)
		if err != nil || !bytes.Equal(c.Params, fx.cmd.Params) {
			t.Fatalf("command: %s %v", c.Params, err)
		}
		d, err := s.GetDeployment(ctx, fx.dep.ID)
		if err != nil || d.Spec.Image.URL != fxURL {
			t.Fatalf("deployment: %v", err)
		}
		im, err := s.GetImage(ctx, "fx-os")
		if err != nil || im.Image.URL != fxURL {
			t.Fatalf("catalog image: %v", err)
		}
	}
	check(s)
	newKey, _, err := s.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check(s)
	k, err = pki.OpenKeyring(filepath.Join(filepath.Dir(fx.data), pki.SecretsKeyFile), false)
	if err != nil {
		t.Fatal(err)
	}
	if ids := k.KeyIDs(); len(ids) != 1 || ids[0] != newKey {
		t.Fatalf("keyring after the rotation: %v, want only %s", ids, newKey)
	}
	s, _ = Wrap(fx.s.Store, k)
	check(s)
	// Nothing is left under a retired key.
	n, err := s.RewriteSecrets(ctx)
	if err != nil || n != 0 {
		t.Errorf("a reseal after the rotation changed %d values (%v)", n, err)
	}
	// No stored value is under the retired key (the WAL may still hold old
	// frames of the rows; the rows themselves must not).
	refs := 0
	if _, err := s.Store.(store.SecretRewriter).RewriteSecrets(ctx, func(f store.SecretField, v string) (string, error) {
		if strings.Contains(v, pki.SealedPrefix+oldKey+":") {
			refs++
		}
		return v, nil
	}); err != nil || refs > 0 {
		t.Errorf("%d stored values still sealed under the retired key %s (%v)", refs, oldKey, err)
	}
}
