package kmod

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Loader inserts one module file into the kernel. A module that is already loaded
// is not an error.
type Loader interface {
	Load(path string) error
}

// LoaderFunc adapts a function to Loader.
type LoaderFunc func(path string) error

// Load calls f.
func (f LoaderFunc) Load(path string) error { return f(path) }

// Prober loads the modules the machine's hardware needs: it reads every modalias
// under /sys/devices, matches them against the index, and loads what matched with
// its dependencies, in rounds, until a round finds nothing new to load: buses such
// as virtio show their devices only once their own driver (virtio_pci) is in.
type Prober struct {
	// Index is the running kernel's modules.
	Index *Index
	// Sys is the sysfs root; "" is /sys.
	Sys string
	// ProcModules lists the loaded modules; "" is /proc/modules.
	ProcModules string
	// Loader inserts modules; nil is FileLoader.
	Loader Loader
	// Extra are modules to load whatever the hardware, such as filesystems, which
	// no device announces.
	Extra []string
	// Settle is the pause after a round that loaded something, for the devices it
	// brought to appear; 0 is 100ms, negative none.
	Settle time.Duration
	// MaxRounds bounds the rounds; 0 is 8.
	MaxRounds int
	// Log receives one line per module; nil discards.
	Log *slog.Logger
}

// Report says what a Run did.
type Report struct {
	// Loaded are the modules inserted, in order.
	Loaded []string
	// Failed are the modules that did not load, with why.
	Failed map[string]string
	// Devices is the number of distinct modaliases seen in the last round, and
	// Unclaimed those no module in the index matches (often devices whose driver
	// is built in).
	Devices, Unclaimed int
	// Rounds is how many rounds ran.
	Rounds int
}

func (p *Prober) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// Run loads modules until nothing new needs loading, ctx ends, or MaxRounds pass.
// A module that fails is reported and not tried again; modules that need it are
// skipped, since they would fail too.
func (p *Prober) Run(ctx context.Context) (Report, error) {
	rep := Report{Failed: map[string]string{}}
	if p.Index == nil {
		return rep, errors.New("kernel modules: no index")
	}
	loader := p.Loader
	if loader == nil {
		loader = FileLoader{}
	}
	rounds := p.MaxRounds
	if rounds <= 0 {
		rounds = 8
	}
	settle := p.Settle
	if settle == 0 {
		settle = 100 * time.Millisecond
	}
	attempted := map[string]bool{}
	for round := 1; round <= rounds; round++ {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		rep.Rounds = round
		loaded, err := p.loaded()
		if err != nil {
			return rep, err
		}
		aliases, err := p.modaliases()
		if err != nil {
			return rep, err
		}
		want := map[string]bool{}
		rep.Devices, rep.Unclaimed = len(aliases), 0
		for _, a := range aliases {
			ms := p.Index.Match(a)
			if len(ms) == 0 {
				rep.Unclaimed++
			}
			for _, m := range ms {
				want[m] = true
			}
		}
		names := sortedKeys(want)
		names = append(names, p.Extra...)
		var todo []string
		for _, m := range p.Index.Order(names) {
			if !loaded[m] && !attempted[m] {
				todo = append(todo, m)
			}
		}
		if len(todo) == 0 {
			break
		}
		for _, m := range todo {
			attempted[m] = true
			if dep := failedDep(p.Index, m, rep.Failed); dep != "" {
				rep.Failed[m] = "needs " + dep + ", which did not load"
				p.log().Warn("kernel module skipped", "module", m, "reason", rep.Failed[m])
				continue
			}
			path, _ := p.Index.Path(m)
			start := time.Now()
			if err := loader.Load(path); err != nil {
				rep.Failed[m] = err.Error()
				p.log().Warn("kernel module did not load", "module", m, "error", err.Error())
				continue
			}
			rep.Loaded = append(rep.Loaded, m)
			p.log().Debug("kernel module loaded", "module", m, "ms", time.Since(start).Milliseconds())
		}
		if settle > 0 {
			t := time.NewTimer(settle)
			select {
			case <-ctx.Done():
				t.Stop()
				return rep, ctx.Err()
			case <-t.C:
			}
		}
	}
	return rep, nil
}

func failedDep(ix *Index, m string, failed map[string]string) string {
	for _, d := range ix.Deps(m) {
		if _, ok := failed[d]; ok {
			return d
		}
	}
	return ""
}

// loaded reads /proc/modules; a kernel without module support has none.
func (p *Prober) loaded() (map[string]bool, error) {
	path := p.ProcModules
	if path == "" {
		path = "/proc/modules"
	}
	set := map[string]bool{}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return set, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			set[Normalize(f[0])] = true
		}
	}
	return set, sc.Err()
}

// modaliases reads every modalias file under sys/devices, deduplicated and sorted.
// The walk does not follow symlinks, so each device is seen once.
func (p *Prober) modaliases() ([]string, error) {
	root := p.Sys
	if root == "" {
		root = "/sys"
	}
	set := map[string]bool{}
	err := filepath.WalkDir(filepath.Join(root, "devices"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// A device that vanished or a directory we may not read: skip it.
			if d != nil && d.IsDir() && path != filepath.Join(root, "devices") {
				return fs.SkipDir
			}
			if path == filepath.Join(root, "devices") {
				return err
			}
			return nil
		}
		if d.Name() != "modalias" || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if a := strings.TrimSpace(string(b)); a != "" {
			set[a] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules: read modaliases: %w", err)
	}
	out := make([]string, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	sort.Strings(out)
	return out, nil
}
