package deploy

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"runtime"
	"strings"

	"github.com/better-compute/bcd/internal/efiboot"
)

// loaderPaths are where a deploy looks, in the installed ESP, for the loader the
// OS's boot entry starts: the removable-media path first (every UEFI image has
// it, and it is what firmware boots without an entry), then the vendor
// directories shim and grub install into.
func loaderPaths() []string {
	arch := "X64"
	if runtime.GOARCH == "arm64" {
		arch = "AA64"
	}
	lower := strings.ToLower(arch)
	return []string{"/EFI/BOOT/BOOT" + arch + ".EFI", "/EFI/debian/shim" + lower + ".efi", "/EFI/ubuntu/shim" + lower + ".efi",
		"/EFI/debian/grub" + lower + ".efi", "/EFI/ubuntu/grub" + lower + ".efi"}
}

// planBoot works out, on a UEFI machine, the boot order the deploy leaves
// (efiboot.Prepare): nil on BIOS, and nil with a warning where it cannot be kept.
// The image's ESP gets an entry when it holds a loader; without one the network
// entry still goes first.
func (d *Deployer) planBoot(ctx context.Context, in *installed, p *Request, res *Result) *efiboot.Plan {
	if d.UEFI == nil {
		if d.UEFIErr != nil {
			res.Warnings = append(res.Warnings, fmt.Sprintf("the UEFI boot order was not kept (network boot may not come first): %v", d.UEFIErr))
		}
		return nil
	}
	entry, why := d.osBootEntry(ctx, in, p)
	if why != "" {
		res.Warnings = append(res.Warnings, "no UEFI boot entry was written for the OS: "+why)
	}
	plan, err := efiboot.Prepare(d.UEFI, d.NICs, entry)
	if err != nil {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the UEFI boot order was not kept: %v", err))
		return nil
	}
	return plan
}

// osBootEntry is the entry for the installed OS: its ESP's loader, by the
// partition's GPT identity. why says why there is none.
func (d *Deployer) osBootEntry(ctx context.Context, in *installed, p *Request) (*efiboot.OSEntry, string) {
	if in.esp == nil {
		return nil, fmt.Sprintf("the image has no ESP (%v)", in.espErr)
	}
	if in.table == nil || in.table.Kind != "gpt" {
		return nil, "the image's ESP is on an MBR disk (bcd writes entries for GPT disks)"
	}
	loader := ""
	for _, l := range loaderPaths() {
		ok, err := in.esp.exists(ctx, l)
		if err != nil {
			return nil, fmt.Sprintf("reading the ESP (partition %d): %v", in.espPart.Number, err)
		}
		if ok {
			loader = l
			break
		}
	}
	if loader == "" {
		return nil, fmt.Sprintf("the ESP (partition %d) holds none of %s", in.espPart.Number, strings.Join(loaderPaths(), ", "))
	}
	ss := int64(in.table.SectorSize)
	if ss == 0 {
		ss = 512
	}
	name := "image"
	if u, err := url.Parse(p.Image.URL); err == nil && path.Base(u.Path) != "/" && path.Base(u.Path) != "." {
		name = path.Base(u.Path)
	}
	return &efiboot.OSEntry{Description: efiboot.OSPrefix + name,
		FilePath: efiboot.HardDriveFile(uint32(in.espPart.Number), uint64(in.espPart.Start/ss), uint64(in.espPart.Size/ss), in.espPart.GUID, loader)}, ""
}

// applyBoot writes the plan; a failure is a warning: the disk is good, and the
// site agent can still reach the machine through its BMC.
func (d *Deployer) applyBoot(plan *efiboot.Plan, res *Result) {
	if plan == nil {
		return
	}
	if err := plan.Apply(d.UEFI); err != nil {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the UEFI boot order was not kept: %v", err))
		return
	}
	res.BootOrder = plan.Summary
	d.log().Info("deploy: UEFI boot order", "boot_order", plan.Summary)
}
