package selfupdate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzRecords reads arbitrary bytes as each of the three records bcd reads
// back: a bad record is an error naming the file, never a panic, and a
// record that parses writes back to one that parses the same.
func FuzzRecords(f *testing.F) {
	f.Add([]byte(`{"slots":{"a":{"version":"0.1.0","sequence":3,"sha256":"` + strings.Repeat("a", 64) + `","size":10}}}`))
	f.Add([]byte(`{"version":"0.2.0","sequence":5,"from_slot":"a","to_slot":"b","from_version":"dev","deadline":"2026-03-01T12:02:00Z",` +
		`"command_id":"c","revision":7,"started":"2026-03-01T12:00:00Z","swapped_back":{"why":"no Welcome","at":"2026-03-01T12:03:00Z"}}`))
	f.Add([]byte(`{"floor":5,"failed":[{"version":"0.2.0","reason":"bcd 0.2.0 did not start","at":"2026-03-01T12:00:00Z"}]}`))
	f.Add([]byte(`{"floor":-1}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`{"slots":{"c":{}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		check := func(name string, read func(path string) (any, bool, error), write func(path string, v any) error) {
			path := filepath.Join(dir, name)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			v, ok, err := read(path)
			if err != nil {
				if !strings.Contains(err.Error(), path) {
					t.Fatalf("%s: the error %q does not name the file", name, err)
				}
				return
			}
			if !ok {
				t.Fatalf("%s: an existing file read as missing", name)
			}
			if err := write(path, v); err != nil {
				t.Fatalf("%s: rewrite: %v", name, err)
			}
			if _, _, err := read(path); err != nil {
				t.Fatalf("%s: a record bcd wrote does not read back: %v", name, err)
			}
		}
		check(SlotsFile, func(p string) (any, bool, error) { return readRecord(p, parseSlots) },
			func(p string, v any) error { return writeRecord(p, v, slotsJSONMode) })
		check(UpgradeFile, func(p string) (any, bool, error) { return readRecord(p, parseUpgrade) },
			func(p string, v any) error { return writeRecord(p, v, recordMode) })
		check(UpdateFile, func(p string) (any, bool, error) { return readRecord(p, parseUpdate) },
			func(p string, v any) error { return writeRecord(p, v, recordMode) })
	})
}
