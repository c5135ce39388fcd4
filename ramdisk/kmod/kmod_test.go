package kmod

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/internal/testenv"
)

// fakeTree copies testdata/tree into a temporary directory, so a test can add the
// devices a loaded bus driver brings.
func fakeTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS("testdata/tree")); err != nil {
		t.Fatal(err)
	}
	return dst
}

func fakeIndex(t *testing.T, root string) *Index {
	t.Helper()
	ix, err := LoadIndex(filepath.Join(root, "lib/modules/6.1.0-test"))
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"pci:v00001AF4d*sv*sd*bc*sc*i*", "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00", true},
		{"pci:v00001AF4d*sv*sd*bc*sc*i*", "pci:v00008086d00001000sv00001AF4sd00000001bc02sc00i00", false},
		{"pci:v*d*sv*sd*bc01sc06i01*", "pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01", true},
		{"cpu:type:x86,ven*fam*mod*:feature:*0094*", "cpu:type:x86,ven0000fam0006mod003F:feature:,0000,0094,00C0", true},
		{"cpu:type:x86,ven*fam*mod*:feature:*0094*", "cpu:type:x86,ven0000fam0006mod003F:feature:,0000,0095", false},
		{"acpi*:PNP0C0[0-9A-F]:*", "acpi:PNP0C0A:", true},
		{"acpi*:PNP0C0[0-9A-F]:*", "acpi:PNP0C0G:", false},
		{"acpi*:PNP0C0[!0-9]:*", "acpi:PNP0C0A:", true},
		{"acpi*:PNP0C0[^0-9]:*", "acpi:PNP0C05:", false},
		{"a[]]b", "a]b", true},
		{"a[", "a[", true},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{`a\*c`, "a*c", true},
		{`a\*c`, "abc", false},
		{"*/*", "of/x", true},
		{"", "", true},
		{"*", "", true},
		{"a*", "", false},
		{"***a", "bbbba", true},
	} {
		if got := Glob(tc.p, tc.s); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

func TestIndex(t *testing.T) {
	ix := fakeIndex(t, "testdata/tree")
	if got := ix.Match("virtio:d00000001v00001AF4"); !slices.Equal(got, []string{"virtio_net"}) {
		t.Errorf("virtio-net: %v", got)
	}
	// A module whose file name has a dash is found by its kernel name.
	if p, ok := ix.Path("virtio-rng"); !ok || filepath.Base(p) != "virtio-rng.ko.xz" {
		t.Errorf("virtio-rng: %q %v", p, ok)
	}
	if got := ix.Lookup("crc32c"); !slices.Equal(got, []string{"crc32c_generic", "crc32c_intel"}) {
		t.Errorf("crc32c: %v", got)
	}
	if got := ix.Lookup("crc32c-intel"); !slices.Equal(got, []string{"crc32c_intel"}) {
		t.Errorf("crc32c-intel: %v", got)
	}
	if !ix.Builtin("nls_base") || ix.Lookup("nls_base") != nil {
		t.Errorf("nls_base is built in")
	}
	// ext4: its softdep (crypto-crc32c, from modules.softdep) and jbd2's come
	// before it, its symbol dependencies too, in modules.dep's reverse order.
	want := []string{"crc32c_generic", "crc32c_intel", "jbd2", "mbcache", "crc16", "ext4"}
	if got := ix.Order([]string{"ext4"}); !cmp.Equal(got, want) {
		t.Errorf("order of ext4:\n got %v\nwant %v", got, want)
	}
	// vfat gets its codepages first, which no file says.
	want = []string{"nls_cp437", "nls_ascii", "fat", "vfat"}
	if got := ix.Order([]string{"vfat"}); !cmp.Equal(got, want) {
		t.Errorf("order of vfat:\n got %v\nwant %v", got, want)
	}
	want = []string{"virtio_ring", "virtio", "failover", "net_failover", "virtio_net"}
	if got := ix.Order([]string{"virtio-net"}); !cmp.Equal(got, want) {
		t.Errorf("order of virtio-net:\n got %v\nwant %v", got, want)
	}
	// Unknown and built-in names are left out.
	if got := ix.Order([]string{"nls_base", "no_such_module"}); len(got) != 0 {
		t.Errorf("order of unknown: %v", got)
	}
}

func TestIndexRefusesBrokenFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadIndex(dir); err == nil {
		t.Fatal("an empty directory loaded")
	}
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte("kernel/a.ko:\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.alias"), []byte("alias only-two\n"), 0o644)
	if _, err := LoadIndex(dir); err == nil {
		t.Fatal("a malformed modules.alias loaded")
	}
}

// recorder is a Loader that records the order and brings the devices a bus driver
// would: virtio_pci makes the virtio devices of the two virtio PCI functions appear.
type recorder struct {
	root   string
	loaded []string
	fail   map[string]bool
}

func (r *recorder) Load(path string) error {
	name := Normalize(path)
	if r.fail[name] {
		return errors.New("no such device")
	}
	r.loaded = append(r.loaded, name)
	if name == "virtio_pci" {
		for dir, alias := range map[string]string{
			"pci0000_00/0000_00_03.0/virtio0": "virtio:d00000001v00001AF4",
			"pci0000_00/0000_00_04.0/virtio1": "virtio:d00000004v00001AF4",
		} {
			d := filepath.Join(r.root, "sys/devices", dir)
			os.MkdirAll(d, 0o755)
			os.WriteFile(filepath.Join(d, "modalias"), []byte(alias+"\n"), 0o444)
		}
	}
	return nil
}

func TestProberLoadsUntilStable(t *testing.T) {
	root := fakeTree(t)
	rec := &recorder{root: root, fail: map[string]bool{"broken": true}}
	p := &Prober{
		Index:       fakeIndex(t, root),
		Sys:         filepath.Join(root, "sys"),
		ProcModules: filepath.Join(root, "proc/modules"),
		Loader:      rec,
		Extra:       []string{"ext4", "vfat"},
		Settle:      -1,
	}
	rep, err := p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Round 1: the PCI and CPU devices, then the filesystems; e1000e is loaded
	// already, broken fails and needs_broken is skipped. Round 2: the virtio
	// devices virtio_pci brought. Round 3 finds nothing new.
	want := []string{
		"scsi_common", "scsi_mod", "libata", "libahci", "ahci",
		"crc32c_intel",
		"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
		"crc32c_generic", "jbd2", "mbcache", "crc16", "ext4",
		"nls_cp437", "nls_ascii", "fat", "vfat",
		"failover", "net_failover", "virtio_net", "virtio_rng",
	}
	if diff := cmp.Diff(want, rep.Loaded); diff != "" {
		t.Errorf("loaded (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, rec.loaded); diff != "" {
		t.Errorf("loader calls (-want +got):\n%s", diff)
	}
	if rep.Rounds != 3 {
		t.Errorf("rounds = %d, want 3", rep.Rounds)
	}
	if _, ok := rep.Failed["broken"]; !ok {
		t.Errorf("broken not reported: %v", rep.Failed)
	}
	if got := rep.Failed["needs_broken"]; got != "needs broken, which did not load" {
		t.Errorf("needs_broken: %q", got)
	}
	if slices.Contains(rec.loaded, "e1000e") {
		t.Error("e1000e was loaded again")
	}
	// platform:serial8250 and the scsi device match nothing.
	if rep.Unclaimed != 2 {
		t.Errorf("unclaimed = %d, want 2", rep.Unclaimed)
	}

	// A second run finds everything loaded (the recorder's modules now listed).
	procModules, _ := os.ReadFile(p.ProcModules)
	for _, m := range rec.loaded {
		procModules = append(procModules, m+" 1 0 - Live 0x0\n"...)
	}
	os.WriteFile(p.ProcModules, procModules, 0o644)
	rec.loaded = nil
	rep, err = p.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(rec.loaded, func(m string) bool { return m != "broken" }) {
		t.Errorf("second run loaded %v", rec.loaded)
	}
}

func TestProberStopsWithContext(t *testing.T) {
	root := fakeTree(t)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{Index: fakeIndex(t, root), Sys: filepath.Join(root, "sys"), ProcModules: filepath.Join(root, "proc/modules"),
		Loader: LoaderFunc(func(string) error { cancel(); return nil })}
	if _, err := p.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestDebianIndex reads the Debian kernel's real index that scripts/fetch-kernel.sh
// unpacks, when it is there.
func TestDebianIndex(t *testing.T) {
	dirs, _ := filepath.Glob("../../.cache/kernel/current/lib/modules/*")
	if len(dirs) == 0 {
		testenv.Skip(t, "no Debian kernel in .cache/kernel (scripts/fetch-kernel.sh)")
	}
	ix, err := LoadIndex(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	for alias, want := range map[string]string{
		"pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00": "virtio_pci",
		"virtio:d00000001v00001AF4":                             "virtio_net",
		"virtio:d00000002v00001AF4":                             "virtio_blk",
		"pci:v00008086d000010D3sv00008086sd0000A01Fbc02sc00i00": "e1000e",
		"pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01": "ahci",
		"pci:v0000144Dd0000A808sv0000144Dsd0000A801bc01sc08i02": "nvme",
	} {
		if got := ix.Match(alias); !slices.Contains(got, want) {
			t.Errorf("%s matches %v, want %s among them", alias, got, want)
		}
	}
	order := ix.Order([]string{"ext4"})
	pos := func(m string) int { return slices.Index(order, m) }
	if pos("ext4") < 0 || pos("jbd2") < 0 || pos("jbd2") > pos("ext4") || pos("mbcache") > pos("ext4") {
		t.Errorf("ext4 order: %v", order)
	}
	if p := pos("crc32c_generic"); p < 0 || p > pos("ext4") {
		t.Errorf("crc32c_generic is not loaded before ext4: %v", order)
	}
	for _, m := range order {
		if p, ok := ix.Path(m); !ok {
			t.Errorf("%s has no path", m)
		} else if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
}
