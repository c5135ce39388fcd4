package sqlite

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// BenchmarkBootEvent is what serve stores for one machine.booted event of a
// storm: the boot step on the machine (RecordBoot) and the site's event (AddEvent),
// with 1,000 machines registered.
func BenchmarkBootEvent(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "data"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	if err := s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	const machines = 1000
	macs := make([]string, machines)
	for i := range macs {
		macs[i] = fmt.Sprintf("52:54:00:00:%02x:%02x", i>>8, i&0xff)
		m := store.Machine{ID: ids.New(ids.PrefixMachine, now), Site: "fsn1", MachineSpec: store.MachineSpec{MACs: []string{macs[i]}},
			MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: now}, CreatedAt: now, UpdatedAt: now}
		if err := s.CreateMachine(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	data := []byte(`{"stage":"dhcp","mac":"52:54:00:00:00:01","arch":7}`)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		at := now.Add(time.Duration(i) * time.Millisecond)
		if _, err := s.RecordBoot(ctx, "fsn1", macs[i%machines], "dhcp", store.MachineEvent{Time: at, Kind: protocol.EventMachineBooted,
			Message: "stage dhcp (" + macs[i%machines] + ")", NodeID: "node_site", Data: data}); err != nil {
			b.Fatal(err)
		}
		if err := s.AddEvent(ctx, store.Event{NodeID: "node_site", Seq: uint64(i + 1), Kind: protocol.EventMachineBooted, Time: at,
			Level: "info", Message: "dhcp " + macs[i%machines], Data: data, ReceivedAt: at}); err != nil {
			b.Fatal(err)
		}
	}
}
