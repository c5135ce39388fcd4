package testbed

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BusyboxInitramfs writes a gzip'd newc initramfs to dst holding busybox-static and
// initScript as /init, plus files (destination path in the image → source path on
// this machine). It is the small stand-in ramdisk tests boot before the real one.
func BusyboxInitramfs(dst, initScript string, files map[string]string) error {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		busybox = "/bin/busybox"
	}
	stage, err := os.MkdirTemp("", "bcd-initramfs-")
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	defer os.RemoveAll(stage)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	if err := copyFile(busybox, filepath.Join(stage, "bin/busybox")); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(stage, "bin/busybox"), 0o755); err != nil {
		return err
	}
	if err := os.Symlink("busybox", filepath.Join(stage, "bin/sh")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stage, "init"), []byte(initScript), 0o755); err != nil {
		return err
	}
	for to, from := range files {
		p := filepath.Join(stage, filepath.Clean("/"+to))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := copyFile(from, p); err != nil {
			return err
		}
		if fi, err := os.Stat(from); err == nil {
			os.Chmod(p, fi.Mode().Perm())
		}
	}
	// cpio reads the file list from find; -H newc is what the kernel unpacks.
	cmd := exec.Command("sh", "-c", `find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 | gzip -1 > "$1"`, "sh", dst)
	cmd.Dir = stage
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testbed: build initramfs %s: %v: %s", dst, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// MarkerInit is an /init script that mounts /proc, prints the kernel command line and
// then line on the console, and powers off.
func MarkerInit(line string) string {
	return `#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
echo "cmdline: $(/bin/busybox cat /proc/cmdline)"
echo "` + line + `"
/bin/busybox sync
/bin/busybox poweroff -f
`
}
