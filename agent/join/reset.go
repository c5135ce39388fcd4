package join

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/journal"
)

// Move is one file set aside: nothing an identity leaves is ever deleted, so an
// operator can still read it (or recover from a mistaken reset).
type Move struct {
	From, To string
}

// stamp is the suffix moved files get: UTC, sortable, and free of characters a
// shell would trip on.
func stamp(now time.Time) string { return now.UTC().Format("20060102T150405Z") }

// asideName returns base+suffix, or with -1, -2… appended when that exists already.
func asideName(base, suffix string) string {
	name := base + suffix
	for i := 1; ; i++ {
		if _, err := os.Lstat(name); errors.Is(err, fs.ErrNotExist) {
			return name
		}
		name = base + suffix + "-" + strconv.Itoa(i)
	}
}

// ResetPlan lists what bcd join --reset moves: node.key, node.key.next, identity.json and the
// journal, each that exists, to <name>.reset-<UTC time>.
func ResetPlan(dataDir, journalPath string, now time.Time) ([]Move, error) {
	var moves []Move
	for _, p := range []string{
		filepath.Join(dataDir, agent.KeyFile),
		filepath.Join(dataDir, agent.KeyNextFile),
		filepath.Join(dataDir, agent.IdentityFile),
		journalPath,
	} {
		_, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, fmt.Errorf("--reset: %w", err)
		}
		moves = append(moves, Move{From: p, To: asideName(p, ".reset-"+stamp(now))})
	}
	return moves, nil
}

// ApplyMoves renames each file and returns the moves that were done, which on an
// error are the ones before it.
func ApplyMoves(moves []Move) ([]Move, error) {
	for i, m := range moves {
		if err := os.Rename(m.From, m.To); err != nil {
			return moves[:i], fmt.Errorf("move %s aside: %w", m.From, err)
		}
	}
	return moves, nil
}

// moveForeignJournal moves aside a journal that an earlier identity left, so the
// new node starts its own. A journal of the same node (a reclaim) stays, and one that
// cannot be read is left for bcd node, which moves a corrupt journal aside itself.
func moveForeignJournal(path, nodeID string, now time.Time, log *slog.Logger) (*Move, error) {
	owner, err := journal.Owner(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		log.Warn("could not read the owner of the existing journal; leaving it", "path", path, "error", err.Error())
		return nil, nil
	case owner == "" || owner == nodeID:
		return nil, nil
	}
	m := Move{From: path, To: asideName(path, ".node-"+owner+"-"+stamp(now))}
	if _, err := ApplyMoves([]Move{m}); err != nil {
		return nil, err
	}
	return &m, nil
}

// resetSuffix is how the names ResetPlan gives begin after the file's own.
const resetSuffix = ".reset-"

// MovedIdentity is the newest identity that bcd join --reset moved aside in
// dataDir and that still loads (identity.json.reset-<time> with the
// node.key.reset-<time> its certificate certifies, or the node.key.next of a
// renewal under way), with the key loaded through keys (a key in the TPM
// signs there); nil when there is none. Its key proves a reclaim of its node
// (protocol.ReclaimProof). One that does not load is logged and passed over.
func MovedIdentity(dataDir string, keys agent.KeyStore, log *slog.Logger) *agent.Identity {
	names, err := filepath.Glob(filepath.Join(dataDir, agent.IdentityFile+resetSuffix+"*"))
	if err != nil || len(names) == 0 {
		return nil
	}
	type moved struct {
		suffix, stamp string
		n             int
	}
	var ms []moved
	for _, name := range names {
		suffix := strings.TrimPrefix(filepath.Base(name), agent.IdentityFile)
		stamp, n, _ := strings.Cut(strings.TrimPrefix(suffix, resetSuffix), "-")
		i, _ := strconv.Atoi(n)
		ms = append(ms, moved{suffix: suffix, stamp: stamp, n: i})
	}
	// Newest first: by the time of the reset, then by the -N a second reset
	// within the same second got.
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].stamp != ms[j].stamp {
			return ms[i].stamp > ms[j].stamp
		}
		return ms[i].n > ms[j].n
	})
	for _, m := range ms {
		id, err := agent.LoadIdentityFiles(filepath.Join(dataDir, agent.IdentityFile+m.suffix),
			filepath.Join(dataDir, agent.KeyFile+m.suffix), filepath.Join(dataDir, agent.KeyNextFile+m.suffix), keys)
		if err != nil {
			log.Warn("an identity bcd join --reset moved aside does not load; not proving its node with it",
				"identity", agent.IdentityFile+m.suffix, "err", err.Error())
			continue
		}
		return id
	}
	return nil
}
