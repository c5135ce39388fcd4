package testbed

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Where the boot loaders come from (Debian's syslinux-common, syslinux and
// systemd-boot-efi).
const (
	gptMBR   = "/usr/lib/syslinux/mbr/gptmbr.bin"
	efiStub  = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	espStart = 2048 // sectors: the ESP starts at 1 MiB
)

// BootDisk describes a disk image that both firmwares boot without a network: a GPT
// with an ESP (FAT32) holding the kernel and initramfs. OVMF boots
// \EFI\BOOT\BOOTX64.EFI, a unified kernel image (the systemd EFI stub with the
// kernel, initramfs and command line inside); SeaBIOS boots syslinux from the same
// ESP through gptmbr.bin and the partition's legacy-BIOS-bootable attribute.
type BootDisk struct {
	Path    string
	SizeMiB int // whole disk; default 128
	ESPMiB  int // default 64
	// Kernel, Initrd and Cmdline are what both loaders boot.
	Kernel, Initrd, Cmdline string
	// RootDir, if set, becomes an ext4 partition labelled "root" after the ESP,
	// made with mkfs.ext4 -d from that directory.
	RootDir string
}

// Build writes the image. It needs sgdisk, mkfs.vfat, mtools, syslinux, objcopy and,
// with RootDir, mkfs.ext4.
func (d BootDisk) Build() error {
	size := d.SizeMiB
	if size == 0 {
		size = 128
	}
	esp := d.ESPMiB
	if esp == 0 {
		esp = 64
	}
	work, err := os.MkdirTemp("", "bcd-disk-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// The unified kernel image: section addresses as the systemd stub's own
	// documentation gives them for a kernel below 32 MiB.
	cmdline := filepath.Join(work, "cmdline")
	osrel := filepath.Join(work, "os-release")
	uki := filepath.Join(work, "BOOTX64.EFI")
	os.WriteFile(cmdline, []byte(d.Cmdline+"\x00"), 0o644)
	os.WriteFile(osrel, []byte("ID=bcdtest\nNAME=\"bcd test disk\"\n"), 0o644)
	if err := run("objcopy",
		"--add-section", ".osrel="+osrel, "--change-section-vma", ".osrel=0x20000",
		"--add-section", ".cmdline="+cmdline, "--change-section-vma", ".cmdline=0x30000",
		"--add-section", ".linux="+d.Kernel, "--change-section-vma", ".linux=0x2000000",
		"--add-section", ".initrd="+d.Initrd, "--change-section-vma", ".initrd=0x3000000",
		efiStub, uki); err != nil {
		return err
	}

	fat := filepath.Join(work, "esp.img")
	if err := run("truncate", "-s", fmt.Sprintf("%dM", esp), fat); err != nil {
		return err
	}
	// -s 1: small FAT32s are refused by mtools unless each cluster is one sector.
	if err := run("mkfs.vfat", "-F", "32", "-s", "1", "-n", "ESP", fat); err != nil {
		return err
	}
	syslinuxCfg := filepath.Join(work, "syslinux.cfg")
	os.WriteFile(syslinuxCfg, []byte("DEFAULT bcd\nPROMPT 0\nTIMEOUT 0\nLABEL bcd\n  LINUX /vmlinuz\n  INITRD /initrd\n  APPEND "+d.Cmdline+"\n"), 0o644)
	for _, c := range [][]string{
		{"mmd", "-i", fat, "::/EFI", "::/EFI/BOOT", "::/syslinux"},
		{"mcopy", "-i", fat, uki, "::/EFI/BOOT/BOOTX64.EFI"},
		{"mcopy", "-i", fat, d.Kernel, "::/vmlinuz"},
		{"mcopy", "-i", fat, d.Initrd, "::/initrd"},
		{"mcopy", "-i", fat, syslinuxCfg, "::/syslinux/syslinux.cfg"},
		{"syslinux", "--install", "--directory", "/syslinux", fat},
	} {
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}

	if err := run("truncate", "-s", fmt.Sprintf("%dM", size), d.Path); err != nil {
		return err
	}
	args := []string{"--clear",
		fmt.Sprintf("--new=1:%d:+%dM", espStart, esp), "--typecode=1:ef00", "--change-name=1:ESP",
		"--attributes=1:set:2"} // legacy BIOS bootable: gptmbr.bin boots this partition
	if d.RootDir != "" {
		args = append(args, "--new=2:0:0", "--typecode=2:8304", "--change-name=2:root")
	}
	if err := run("sgdisk", append(args, d.Path)...); err != nil {
		return err
	}
	if err := run("dd", "if="+fat, "of="+d.Path, "bs=1M", fmt.Sprintf("seek=%d", espStart*512/(1<<20)), "conv=notrunc,fsync", "status=none"); err != nil {
		return err
	}
	if err := run("dd", "if="+gptMBR, "of="+d.Path, "bs=440", "count=1", "conv=notrunc", "status=none"); err != nil {
		return err
	}
	if d.RootDir != "" {
		rootStart := int64(espStart)*512 + int64(esp)<<20
		rootSize := int64(size)<<20 - rootStart - 1<<20 // the backup GPT lives in the last MiB
		root := filepath.Join(work, "root.img")
		if err := run("truncate", "-s", fmt.Sprint(rootSize), root); err != nil {
			return err
		}
		if err := run("mkfs.ext4", "-q", "-F", "-L", "root", "-d", d.RootDir, root); err != nil {
			return err
		}
		if err := run("dd", "if="+root, "of="+d.Path, "bs=1M", fmt.Sprintf("seek=%d", rootStart>>20), "conv=notrunc,fsync", "status=none"); err != nil {
			return err
		}
	}
	return nil
}

func run(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testbed: %s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
