package efiboot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	"github.com/u-root/u-root/pkg/efivarfs"
)

// DirVars is a directory of files laid out as efivarfs lays them out
// (Name-GUID, 4 bytes of attributes then the value). efivarfs.New refuses
// anything but the kernel's filesystem; tests use this, on a machine without
// UEFI, to run the same code against variables written as firmware writes them.
type DirVars string

var _ efivarfs.EFIVar = DirVars("")

func (d DirVars) path(desc efivarfs.VariableDescriptor) string {
	return filepath.Join(string(d), desc.Name+"-"+desc.GUID.String())
}

// Get implements efivarfs.EFIVar.
func (d DirVars) Get(desc efivarfs.VariableDescriptor) (efivarfs.VariableAttributes, []byte, error) {
	b, err := os.ReadFile(d.path(desc))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil, efivarfs.ErrVarNotExist
	}
	if err != nil {
		return 0, nil, err
	}
	if len(b) < 4 {
		return 0, nil, efivarfs.ErrVarNotExist
	}
	return efivarfs.VariableAttributes(binary.LittleEndian.Uint32(b)), b[4:], nil
}

// Set implements efivarfs.EFIVar.
func (d DirVars) Set(desc efivarfs.VariableDescriptor, attrs efivarfs.VariableAttributes, data []byte) error {
	b := make([]byte, 4+len(data))
	binary.LittleEndian.PutUint32(b, uint32(attrs))
	copy(b[4:], data)
	return os.WriteFile(d.path(desc), b, 0o644)
}

// Remove implements efivarfs.EFIVar.
func (d DirVars) Remove(desc efivarfs.VariableDescriptor) error {
	err := os.Remove(d.path(desc))
	if errors.Is(err, os.ErrNotExist) {
		return efivarfs.ErrVarNotExist
	}
	return err
}

// List implements efivarfs.EFIVar.
func (d DirVars) List() ([]efivarfs.VariableDescriptor, error) {
	ents, err := os.ReadDir(string(d))
	if err != nil {
		return nil, err
	}
	var out []efivarfs.VariableDescriptor
	for _, e := range ents {
		name := e.Name()
		if len(name) < 38 || name[len(name)-37] != '-' {
			continue
		}
		g, err := uuid.Parse(name[len(name)-36:])
		if err != nil {
			continue
		}
		out = append(out, efivarfs.VariableDescriptor{Name: strings.TrimSuffix(name[:len(name)-36], "-"), GUID: g})
	}
	return out, nil
}

// Booted reports whether this machine booted through UEFI firmware (Linux
// shows /sys/firmware/efi then).
func Booted() bool {
	_, err := os.Stat("/sys/firmware/efi")
	return err == nil
}

// Open returns the kernel's efivarfs at dir ("" is /sys/firmware/efi/efivars),
// or, with dirVars, a DirVars there.
func Open(dir string, dirVars bool) (efivarfs.EFIVar, error) {
	if dirVars {
		if dir == "" {
			return nil, errors.New("efiboot: a directory of variables needs its path")
		}
		return DirVars(dir), nil
	}
	if dir == "" {
		dir = efivarfs.DefaultVarFS
	}
	v, err := efivarfs.NewPath(dir)
	if err != nil {
		return nil, fmt.Errorf("efivarfs at %s: %w", dir, err)
	}
	return v, nil
}
