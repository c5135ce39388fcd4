package selfupdate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// TestStatusNeverUpdated: bcd update and bcd doctor on a host that never
// updated read nothing that is not there and write nothing.
func TestStatusNeverUpdated(t *testing.T) {
	h := newHost(t)
	before := listTree(t, h.root)
	st, err := h.manager("0.1.0").Status()
	must(t, err)
	if st.Current != "" || st.Previous != "" || len(st.Slots) != 0 || st.Pending != nil || len(st.Failed) != 0 ||
		st.Floor != 3 || st.EntrypointTarget != "" || st.EntrypointLinked || st.InUse() {
		t.Errorf("%+v", st)
	}
	if after := listTree(t, h.root); !reflect.DeepEqual(before, after) {
		t.Errorf("Status wrote files: %v -> %v", before, after)
	}
}

// TestStatusJSON: the keys bcd update -o json prints, during an update.
func TestStatusJSON(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	st, err := h.manager("0.2.0").Status()
	must(t, err)
	if st.Current != SlotB || st.Previous != SlotA || !st.EntrypointLinked || st.Pending == nil || st.Pending.Version != "0.2.0" ||
		st.Pending.ToSlot != SlotB || st.Pending.CommandID != "cmd-0.2.0" || st.Slots[SlotB].Sequence != 5 {
		t.Errorf("%+v", st)
	}
	data, err := json.Marshal(st)
	must(t, err)
	var keys map[string]json.RawMessage
	must(t, json.Unmarshal(data, &keys))
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	sort.Strings(got)
	want := []string{"current", "entrypoint", "entrypoint_linked", "entrypoint_target", "failed", "floor", "pending", "previous", "slots", "slots_dir"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
	var pending map[string]any
	must(t, json.Unmarshal(keys["pending"], &pending))
	for _, k := range []string{"version", "sequence", "to_slot", "from_slot", "deadline", "command_id"} {
		if _, ok := pending[k]; !ok {
			t.Errorf("pending lacks %q: %s", k, keys["pending"])
		}
	}
	var slots map[string]map[string]any
	must(t, json.Unmarshal(keys["slots"], &slots))
	for _, k := range []string{"version", "sequence", "sha256", "size"} {
		if _, ok := slots["a"][k]; !ok {
			t.Errorf("slot a lacks %q", k)
		}
	}

	h.confirm("0.2.0")
	st, err = h.manager("0.2.0").Status()
	must(t, err)
	if st.Pending != nil || st.Floor != 5 {
		t.Errorf("after confirm: %+v", st)
	}
}

// TestStatusBadRecord: a record bcd did not write is an error naming it.
func TestStatusBadRecord(t *testing.T) {
	h := newHost(t)
	path := filepath.Join(h.opts.RecordsDir, UpdateFile)
	writeFile(t, path, `{"floor": 1, "surprise": true}`)
	_, err := h.manager("0.1.0").Status()
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want an error naming %s", err, path)
	}
}

func listTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	must(t, filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out = append(out, path)
		return nil
	}))
	return out
}
