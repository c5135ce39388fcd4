package protocol

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// DeployImageParams are the params of a deploy.image command: which image to stream
// onto which disk, the files to write into the installed filesystems afterwards, and
// what the ramdisk does once the disk is good. They carry secrets (the join token in
// Files), so nothing that prints them may print Files' content: FileContent's String
// says only how long it is.
type DeployImageParams struct {
	Image  DeployImage  `json:"image"`
	Target DeployTarget `json:"target"`
	// Files are written into the root filesystem or the ESP once the image is
	// verified, replacing what the image has at those paths.
	Files []DeployFile `json:"files,omitempty"`
	After DeployAfter  `json:"after"`
	// Proxy is an HTTP proxy URL to fetch the image through; empty means the
	// agent's own (bcd.proxy for the ramdisk), or none.
	Proxy string `json:"proxy,omitempty"`
	// RootPartition and ESPPartition force a partition number (1-based); zero means
	// find it (see the deploy package).
	RootPartition int `json:"root_partition,omitempty"`
	ESPPartition  int `json:"esp_partition,omitempty"`
	// NodeAgent, when set, is the bcd release the ramdisk installs into the
	// root filesystem (a stock image that does not ship bcd): the binary,
	// bcd.service, the join unit and their enable symlinks.
	NodeAgent *DeployNodeAgent `json:"node_agent,omitempty"`
}

// DeployNodeAgent is the node agent binary a deploy installs: one release's
// binary for the machine's architecture, checked against SHA256 before
// anything is written.
type DeployNodeAgent struct {
	Version string `json:"version"`
	URL     string `json:"url"`
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size,omitempty"`
}

// Validate checks the URL and the digest.
func (a *DeployNodeAgent) Validate() error {
	u, err := url.Parse(a.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("node_agent.url: want an https URL")
	}
	if _, err := hex.DecodeString(a.SHA256); err != nil || len(a.SHA256) != 64 || strings.ToLower(a.SHA256) != a.SHA256 {
		return fmt.Errorf("node_agent.sha256: want 64 lowercase hex digits")
	}
	if a.Size < 0 || a.Size > MaxNodeAgentSize {
		return fmt.Errorf("node_agent.size: %d is not between 0 and %d", a.Size, MaxNodeAgentSize)
	}
	if a.Version == "" || len(a.Version) > 128 {
		return fmt.Errorf("node_agent.version: required, at most 128 bytes")
	}
	return nil
}

// MaxNodeAgentSize bounds the node agent binary a deploy downloads.
const MaxNodeAgentSize = 512 << 20

// NoCloudSeedDir is where a deploy writes the cloud-init NoCloud seed
// (meta-data, user-data, network-config) in the installed root.
const NoCloudSeedDir = "/var/lib/cloud/seed/nocloud"

// Image formats of DeployImage.Format.
const (
	FormatRaw   = "raw"
	FormatGzip  = "raw.gz"
	FormatXZ    = "raw.xz"
	FormatZstd  = "raw.zst"
	FormatQCOW2 = "qcow2"
)

// DeployImage says where the image is and what its served bytes must be.
type DeployImage struct {
	// URL is https (http only where the agent allows it). Userinfo and query are
	// never echoed in errors.
	URL string `json:"url"`
	// SHA256 is lowercase hex over the bytes as served (the compressed stream for a
	// compressed format).
	SHA256 string `json:"sha256"`
	// Size is the served length in bytes.
	Size int64 `json:"size"`
	// Format is raw, raw.gz, raw.xz, raw.zst or qcow2; empty means tell from the
	// stream's first bytes.
	Format string `json:"format,omitempty"`
	// ImageSize is the disk image's length once decompressed: required for a
	// compressed format (it picks the disk and bounds the write), equal to Size or
	// zero for raw; for qcow2, zero or the header's virtual size.
	ImageSize int64 `json:"image_size,omitempty"`
}

// DeployTarget selects the disk: by Serial, by Path, or, with neither, the smallest
// non-removable disk at least as large as the image.
//
// RootDevice is root-device hints as Ironic's root_device, comma-separated
// key=value: serial, wwn, model, vendor, name (sda or /dev/sda), by_path
// (/dev/disk/by-path/…), rotational (true/false), size (=, >= or <=, in bytes or
// with KB, MB, GB, TB, KiB, MiB, GiB, TiB). Exactly one disk must match them all,
// unless FirstMatch (then the first by name). RootDevice excludes Serial and Path.
type DeployTarget struct {
	Serial     string `json:"serial,omitempty"`
	Path       string `json:"path,omitempty"`
	RootDevice string `json:"root_device,omitempty"`
	FirstMatch bool   `json:"first_match,omitempty"`
}

// Filesystems a DeployFile or a kernel can be in.
const (
	FSRoot = "root" // the installed root filesystem (ext2/3/4)
	FSESP  = "esp"  // the EFI system partition (FAT)
)

// DeployFile is one file to write into the installed OS.
type DeployFile struct {
	// FS is FSRoot (the default) or FSESP.
	FS string `json:"fs,omitempty"`
	// Path is absolute within that filesystem: /etc/bcd/join-token,
	// /EFI/BOOT/grub.cfg. Directories are created as needed (0755, root).
	Path string `json:"path"`
	// Mode, UID and GID apply in the root filesystem; FAT has none.
	Mode    FileMode    `json:"mode"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
	Content FileContent `json:"content"`
}

// FileMode is a permission mode, written in JSON as an octal string ("0600").
type FileMode uint32

// MarshalJSON writes the mode as "0600".
func (m FileMode) MarshalJSON() ([]byte, error) {
	return json.Marshal(fmt.Sprintf("%04o", uint32(m)))
}

// UnmarshalJSON reads "0600" (octal, with or without the leading 0).
func (m *FileMode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("mode: want an octal string such as \"0600\": %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || v > 0o7777 {
		return fmt.Errorf("mode %q: want an octal permission mode such as \"0600\"", s)
	}
	*m = FileMode(v)
	return nil
}

// FileContent is a file's bytes, base64 in JSON. It prints as its length only, so a
// join token in a deploy's params never reaches a log through %v.
type FileContent []byte

// String says how long the content is, never what it is.
func (c FileContent) String() string { return fmt.Sprintf("[%d bytes]", len(c)) }

// GoString is String, for %#v.
func (c FileContent) GoString() string { return c.String() }

// What the ramdisk does after a good deploy (DeployAfter.Action).
const (
	AfterNone     = "none"
	AfterKexec    = "kexec"
	AfterReboot   = "reboot"
	AfterPowerOff = "poweroff"
)

// DeployAfter is what happens once the disk is written and checked. For kexec the
// kernel, initrd and command line are found in the image unless given here (see the
// deploy package for where it looks).
type DeployAfter struct {
	// Action is none (the default), kexec, reboot or poweroff.
	Action string `json:"action,omitempty"`
	// Kernel and Initrd are paths in FS (root by default).
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	FS      string `json:"fs,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
}

// DeployImageResult is the result of a deploy.image that succeeded. Each field is
// named as the params name the same thing: Target is the disk params.target chose
// (its path, and its serial where it has one), ImageSize the image bytes written
// (image.image_size, or image.size for raw), Size the served bytes received
// (image.size), SHA256 their digest (image.sha256).
//
// The JSON names changed with the Go names (they were disk, disk_serial,
// bytes_written and bytes_received). UnmarshalJSON still reads those: a ramdisk
// booted before a control plane upgrade can finish its deploy after it.
type DeployImageResult struct {
	Target DeployTarget `json:"target"`
	// ChosenBy says why the deploy wrote that disk: "hints serial=S1,size>=100GiB",
	// "serial S1", "path /dev/sda", "smallest non-removable disk >= N bytes".
	ChosenBy      string   `json:"chosen_by,omitempty"`
	ImageSize     int64    `json:"image_size"`
	Size          int64    `json:"size"`
	SHA256        string   `json:"sha256"`
	DurationMS    int64    `json:"duration_ms"`
	RootPartition int      `json:"root_partition,omitempty"`
	RootPartUUID  string   `json:"root_partuuid,omitempty"`
	ESPPartition  int      `json:"esp_partition,omitempty"`
	Files         []string `json:"files,omitempty"` // fs:path of each file written
	Kernel        string   `json:"kernel,omitempty"`
	Initrd        string   `json:"initrd,omitempty"`
	Cmdline       string   `json:"cmdline,omitempty"`
	After         string   `json:"after"`
	Warnings      []string `json:"warnings,omitempty"`
	// BootOrder says how a UEFI machine's boot order was left: "BootOrder
	// 0003,0007,0001: network Boot0003 \"UEFI PXEv4 (MAC:…)\" first, then Boot0007
	// \"bcd: debian.qcow2\"". Empty on BIOS (and where it could not be kept:
	// a warning says why).
	BootOrder string `json:"boot_order,omitempty"`
	// Wiped names the old signatures removed from the disk before the write.
	Wiped []string `json:"wiped,omitempty"`
}

// UnmarshalJSON reads a result in today's names or, where those are absent, in the
// names of earlier versions (see DeployImageResult).
func (r *DeployImageResult) UnmarshalJSON(b []byte) error {
	type plain DeployImageResult // without this method
	var v struct {
		plain
		Disk          string `json:"disk"`
		DiskSerial    string `json:"disk_serial"`
		BytesWritten  int64  `json:"bytes_written"`
		BytesReceived int64  `json:"bytes_received"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = DeployImageResult(v.plain)
	if r.Target == (DeployTarget{}) {
		r.Target = DeployTarget{Path: v.Disk, Serial: v.DiskSerial}
	}
	if r.ImageSize == 0 {
		r.ImageSize = v.BytesWritten
	}
	if r.Size == 0 {
		r.Size = v.BytesReceived
	}
	return nil
}

// Reasons a deploy.image fails with (Status.Reason).
const (
	DeployReasonInvalid        = "invalid-params"
	DeployReasonNotImplemented = "not-implemented"
	DeployReasonNoDisk         = "no-disk"
	DeployReasonDownload       = "download-failed"
	DeployReasonDigest         = "digest-mismatch"
	DeployReasonSize           = "size-mismatch"
	DeployReasonDecompress     = "decompress-failed"
	DeployReasonWrite          = "write-failed"
	DeployReasonPartitions     = "partitions"
	DeployReasonFiles          = "files-failed"
	DeployReasonKernel         = "kernel"
	DeployReasonCancelled      = "cancelled"
	DeployReasonTool           = "tool-missing"
)

// MaxDeployFiles and MaxDeployFileSize bound what one deploy writes into the
// installed OS: configuration and boot files, not payloads.
const (
	MaxDeployFiles    = 256
	MaxDeployFileSize = 64 << 20
)

// Validate checks what can be checked without the machine: the agent applies its
// own policy (http allowed or not, formats it implements) on top.
func (p *DeployImageParams) Validate() error {
	u, err := url.Parse(p.Image.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("image.url: want an https URL")
	}
	if len(p.Image.SHA256) != 64 || strings.ToLower(p.Image.SHA256) != p.Image.SHA256 {
		return fmt.Errorf("image.sha256: want 64 lowercase hex digits")
	}
	if _, err := hex.DecodeString(p.Image.SHA256); err != nil {
		return fmt.Errorf("image.sha256: want 64 lowercase hex digits")
	}
	if p.Image.Size <= 0 {
		return fmt.Errorf("image.size: want the served length in bytes")
	}
	switch p.Image.Format {
	case "":
		// Told from the stream; a compressed one then needs image_size.
	case FormatRaw:
		if p.Image.ImageSize != 0 && p.Image.ImageSize != p.Image.Size {
			return fmt.Errorf("image.image_size: %d differs from image.size %d for a raw image", p.Image.ImageSize, p.Image.Size)
		}
	case FormatGzip, FormatXZ, FormatZstd:
		if p.Image.ImageSize <= 0 {
			return fmt.Errorf("image.image_size: required for format %s", p.Image.Format)
		}
	case FormatQCOW2:
	default:
		return fmt.Errorf("image.format: %q is not one of raw, raw.gz, raw.xz, raw.zst, qcow2", p.Image.Format)
	}
	if p.Image.ImageSize < 0 {
		return fmt.Errorf("image.image_size: negative")
	}
	if err := p.Target.validateRootDevice(); err != nil {
		return err
	}
	if p.Target.Serial != "" && p.Target.Path != "" {
		return fmt.Errorf("target: give serial or path, not both")
	}
	if p.Target.Path != "" && !path.IsAbs(p.Target.Path) {
		return fmt.Errorf("target.path: want an absolute path")
	}
	if p.Proxy != "" {
		pu, err := url.Parse(p.Proxy)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("proxy: want an http:// or https:// proxy URL")
		}
	}
	if p.RootPartition < 0 || p.ESPPartition < 0 {
		return fmt.Errorf("root_partition, esp_partition: want a partition number")
	}
	if len(p.Files) > MaxDeployFiles {
		return fmt.Errorf("files: %d files, at most %d", len(p.Files), MaxDeployFiles)
	}
	seen := map[string]bool{}
	for i, f := range p.Files {
		fs := f.FS
		if fs == "" {
			fs = FSRoot
		}
		if fs != FSRoot && fs != FSESP {
			return fmt.Errorf("files[%d].fs: %q is not root or esp", i, f.FS)
		}
		if err := ValidDeployPath(f.Path); err != nil {
			return fmt.Errorf("files[%d].path: %w", i, err)
		}
		key := fs + ":" + f.Path
		if fs == FSESP {
			key = strings.ToLower(key) // FAT names are case-insensitive
		}
		if seen[key] {
			return fmt.Errorf("files[%d].path: %s:%s given twice", i, fs, f.Path)
		}
		seen[key] = true
		if f.Mode > 0o7777 {
			return fmt.Errorf("files[%d].mode: %o is not a permission mode", i, uint32(f.Mode))
		}
		if f.UID < 0 || f.GID < 0 || f.UID > 1<<31-2 || f.GID > 1<<31-2 {
			return fmt.Errorf("files[%d]: uid and gid must be between 0 and 2147483646", i)
		}
		if len(f.Content) > MaxDeployFileSize {
			return fmt.Errorf("files[%d].content: %d bytes, at most %d", i, len(f.Content), MaxDeployFileSize)
		}
	}
	if err := p.After.Validate(); err != nil {
		return fmt.Errorf("after.%w", err)
	}
	if p.NodeAgent != nil {
		if err := p.NodeAgent.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the action, the paths and the command line.
func (a *DeployAfter) Validate() error {
	switch a.Action {
	case "", AfterNone, AfterKexec, AfterReboot, AfterPowerOff:
	default:
		return fmt.Errorf("action: %q is not none, kexec, reboot or poweroff", a.Action)
	}
	if a.FS != "" && a.FS != FSRoot && a.FS != FSESP {
		return fmt.Errorf("fs: %q is not root or esp", a.FS)
	}
	if a.Kernel != "" {
		if err := ValidDeployPath(a.Kernel); err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
	}
	if a.Initrd != "" {
		if a.Kernel == "" {
			return fmt.Errorf("initrd: given without kernel")
		}
		if err := ValidDeployPath(a.Initrd); err != nil {
			return fmt.Errorf("initrd: %w", err)
		}
	}
	if strings.ContainsAny(a.Cmdline, "\x00\n\r") || len(a.Cmdline) > 4096 {
		return fmt.Errorf("cmdline: one line of at most 4096 bytes")
	}
	return nil
}

// ValidDeployPath accepts an absolute, clean path of plain names (letters, digits and
// . _ - + @ ,), which both debugfs's command parser and mtools take literally.
func ValidDeployPath(p string) error {
	if !strings.HasPrefix(p, "/") || p == "/" || len(p) > 1024 {
		return fmt.Errorf("%q: want an absolute path to a file", p)
	}
	if path.Clean(p) != p {
		return fmt.Errorf("%q: not a clean path (no //, . or .. components, no trailing /)", p)
	}
	for _, name := range strings.Split(p[1:], "/") {
		if name == "." || name == ".." || len(name) > 255 {
			return fmt.Errorf("%q: bad component %q", p, name)
		}
		for _, r := range name {
			ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-+@,", r)
			if !ok {
				return fmt.Errorf("%q: character %q is not allowed (letters, digits and ._-+@, only)", p, r)
			}
		}
	}
	return nil
}

// validateRootDevice checks target.root_device: hints that parse, given alone.
func (t DeployTarget) validateRootDevice() error {
	if t.RootDevice == "" {
		if t.FirstMatch {
			return fmt.Errorf("target.first_match: only with target.root_device")
		}
		return nil
	}
	if t.Serial != "" || t.Path != "" {
		return fmt.Errorf("target.root_device: give root_device, serial or path, not two (serial=… is a hint)")
	}
	if _, err := ParseRootDevice(t.RootDevice); err != nil {
		return fmt.Errorf("target.root_device: %v", err)
	}
	return nil
}
