package efiboot

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/u-root/u-root/pkg/efivarfs"
)

// RecordPath is where a deploy records, in the installed root, the network
// entry it put first; bcd-boot-order.service keeps that entry first.
const RecordPath = "/etc/bcd/efi-boot-first"

// Record is the network entry a deploy put first: its number then and its
// value, by which it is found again if firmware renumbers it.
type Record struct {
	Number      string `json:"number"`
	Description string `json:"description"`
	LoadOption  string `json:"load_option"` // hex
}

// ParseRecord reads a Record file.
func ParseRecord(b []byte) (Record, []byte, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, nil, fmt.Errorf("boot record: %w", err)
	}
	raw, err := hex.DecodeString(r.LoadOption)
	if err != nil || len(raw) == 0 {
		return r, nil, errors.New("boot record: load_option is not the hex of a load option")
	}
	if _, err := ParseLoadOption(raw); err != nil {
		return r, nil, fmt.Errorf("boot record: %w", err)
	}
	return r, raw, nil
}

// OSEntry is the entry a deploy writes for the OS it installed.
type OSEntry struct {
	// Description follows OSPrefix: "bcd: debian-12".
	Description string
	// FilePath is the loader's device path (HardDriveFile).
	FilePath []byte
}

// Plan is what a deploy will write: worked out before the disk's files (so the
// root can carry the Record), applied once the disk is good.
type Plan struct {
	table   *Table
	leader  uint16
	os      *LoadOption
	osNum   uint16
	drop    []uint16 // bcd's entries from earlier deploys, and copies of the new one
	Order   []uint16 // BootOrder once applied
	Summary string
}

// Record is the network entry the plan puts first.
func (p *Plan) Record() Record {
	e := p.table.Entries[p.leader]
	return Record{Number: fmt.Sprintf("%04X", p.leader), Description: e.Option.Description, LoadOption: hex.EncodeToString(e.Raw)}
}

// RecordFile is the Record as the installed root holds it.
func (p *Plan) RecordFile() []byte {
	b, _ := json.MarshalIndent(p.Record(), "", "  ")
	return append(b, '\n')
}

// ErrNoNetworkEntry: the firmware holds no boot entry for a NIC, so nothing can
// put network boot first (the machine boots its disk until a BMC or an operator
// says otherwise).
var ErrNoNetworkEntry = errors.New("the firmware has no network boot entry (BootOrder lists no PXE or HTTP entry)")

// Prepare reads the boot variables and works out the order a deploy leaves:
// the network entry that brought the machine here (one of macs' when it is not
// BootCurrent), then the installed OS's entry (osEntry; nil writes none), then
// whatever BootOrder held, in its order. bcd's entries from earlier deploys and
// entries with the same device path as the new one are removed, so a redeploy
// keeps one; the first of them keeps its number.
func Prepare(v efivarfs.EFIVar, macs []net.HardwareAddr, osEntry *OSEntry) (*Plan, error) {
	t, err := Read(v)
	if err != nil {
		return nil, err
	}
	leader, ok := t.networkLeader(macs)
	if !ok {
		return nil, ErrNoNetworkEntry
	}
	p := &Plan{table: t, leader: leader}
	order := []uint16{leader}
	if osEntry != nil {
		lo := LoadOption{Attributes: LoadOptionActive, Description: osEntry.Description, FilePath: osEntry.FilePath}
		p.os = &lo
		var ours []uint16
		for _, n := range t.numbers() {
			e := t.Entries[n]
			if n == leader || e.Err != nil {
				continue
			}
			if strings.HasPrefix(e.Option.Description, OSPrefix) || bytes.Equal(e.Option.FilePath, osEntry.FilePath) {
				ours = append(ours, n)
			}
		}
		if len(ours) > 0 {
			p.osNum, p.drop = ours[0], ours[1:]
		} else if p.osNum, ok = t.free(); !ok {
			return nil, errors.New("no free Boot#### number")
		}
		order = append(order, p.osNum)
	}
	for _, n := range t.Order {
		if !contains(order, n) && !contains(p.drop, n) {
			order = append(order, n)
		}
	}
	p.Order = order
	s := fmt.Sprintf("BootOrder %s: network %s first", FormatOrder(order), t.describe(leader))
	if p.os != nil {
		s += fmt.Sprintf(", then %s %q", BootName(p.osNum), p.os.Description)
	}
	if len(p.drop) > 0 {
		s += fmt.Sprintf("; removed %s", FormatOrder(p.drop))
	}
	p.Summary = s
	return p, nil
}

// Apply writes the OS entry, then BootOrder, then removes the entries it
// replaces (by then out of BootOrder): cut off at any point, the firmware holds
// a BootOrder whose entries all exist.
func (p *Plan) Apply(v efivarfs.EFIVar) error {
	if p.os != nil {
		d := efivarfs.VariableDescriptor{Name: BootName(p.osNum), GUID: GlobalGUID}
		if err := v.Set(d, bootAttrs, p.os.Marshal()); err != nil {
			return fmt.Errorf("write %s: %w", d.Name, err)
		}
	}
	if err := writeOrder(v, p.Order); err != nil {
		return err
	}
	for _, n := range p.drop {
		if err := v.Remove(efivarfs.VariableDescriptor{Name: BootName(n), GUID: GlobalGUID}); err != nil && !errors.Is(err, efivarfs.ErrVarNotExist) {
			return fmt.Errorf("remove %s: %w", BootName(n), err)
		}
	}
	return nil
}

func writeOrder(v efivarfs.EFIVar, order []uint16) error {
	d := efivarfs.VariableDescriptor{Name: "BootOrder", GUID: GlobalGUID}
	if err := v.Set(d, bootAttrs, marshalOrder(order)); err != nil {
		return fmt.Errorf("write BootOrder: %w", err)
	}
	return nil
}

// KeepResult is what Keep found and did.
type KeepResult struct {
	Before, After []uint16
	Leader        uint16
	Changed       bool
}

// String is a log line.
func (r KeepResult) String() string {
	if !r.Changed {
		return fmt.Sprintf("BootOrder %s: %s is first already", FormatOrder(r.Before), BootName(r.Leader))
	}
	return fmt.Sprintf("BootOrder %s → %s: %s first again", FormatOrder(r.Before), FormatOrder(r.After), BootName(r.Leader))
}

// ErrRecordedEntryGone: the entry the deploy put first no longer exists.
var ErrRecordedEntryGone = errors.New("the network boot entry the deploy put first is gone from the firmware")

// Keep puts the recorded network entry first again when something else took its
// place, leaving every other entry in the order it has. The entry is found by
// its value (firmware may renumber entries), then by its description.
func Keep(v efivarfs.EFIVar, rec Record, raw []byte) (KeepResult, error) {
	t, err := Read(v)
	if err != nil {
		return KeepResult{}, err
	}
	leader, found := uint16(0), false
	for _, n := range t.numbers() {
		if bytes.Equal(t.Entries[n].Raw, raw) {
			leader, found = n, true
			break
		}
	}
	if !found && rec.Description != "" {
		for _, n := range t.numbers() {
			if e := t.Entries[n]; e.Err == nil && e.Option.Description == rec.Description {
				if k, _ := e.Option.Describe(); k.Network() {
					leader, found = n, true
					break
				}
			}
		}
	}
	if !found {
		return KeepResult{Before: t.Order}, fmt.Errorf("%w (%s %q)", ErrRecordedEntryGone, rec.Number, rec.Description)
	}
	r := KeepResult{Before: t.Order, Leader: leader}
	r.After = append([]uint16{leader}, without(t.Order, leader)...)
	if len(t.Order) > 0 && t.Order[0] == leader {
		r.After = t.Order
		return r, nil
	}
	if err := writeOrder(v, r.After); err != nil {
		return r, err
	}
	r.Changed = true
	return r, nil
}

// Show lists the boot entries in BootOrder's order, then those outside it, one a
// line, as an operator reads them.
func Show(v efivarfs.EFIVar) (string, error) {
	t, err := Read(v)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "BootOrder: %s\n", FormatOrder(t.Order))
	if t.HasCurrent {
		fmt.Fprintf(&b, "BootCurrent: %04X\n", t.Current)
	}
	list := append([]uint16(nil), t.Order...)
	for _, n := range t.numbers() {
		if !contains(list, n) {
			list = append(list, n)
		}
	}
	for _, n := range list {
		e, ok := t.Entries[n]
		switch {
		case !ok:
			fmt.Fprintf(&b, "%s (in BootOrder, missing)\n", BootName(n))
		case e.Err != nil:
			fmt.Fprintf(&b, "%s (unreadable: %v)\n", BootName(n), e.Err)
		default:
			k, mac := e.Option.Describe()
			active := "*"
			if e.Option.Attributes&LoadOptionActive == 0 {
				active = " "
			}
			line := fmt.Sprintf("%s%s %q %s", BootName(n), active, e.Option.Description, k)
			if mac != nil {
				line += " " + mac.String()
			}
			if !contains(t.Order, n) {
				line += " (not in BootOrder)"
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String(), nil
}
