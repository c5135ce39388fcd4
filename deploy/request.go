package deploy

import (
	"fmt"

	"github.com/better-compute/bcd/protocol"
)

// Request is one deploy, in deploy's own terms: the image to stream, the disk to
// put it on, the files to write into the installed OS and what follows. The
// ramdisk converts deploy.image's protocol.DeployImageParams into one at its edge,
// so the wire format can grow or rename a key without touching how a disk is
// written, and a caller other than the ramdisk (a benchmark, a test, a tool that
// builds disk images) needs no wire type. Format, FS and Action values are the
// protocol's strings (protocol.FormatRaw, protocol.FSRoot, protocol.AfterKexec):
// they are the shared vocabulary, not a wire encoding.
type Request struct {
	Image  Image
	Target Target
	// Files are written into the root filesystem or the ESP once the image is
	// verified, replacing what the image has at those paths.
	Files []File
	After After
	// Proxy is an HTTP proxy URL to fetch the image through; empty means the
	// Deployer's Proxy, or none.
	Proxy string
	// RootPartition and ESPPartition force a partition number (1-based); zero
	// means find it (see the package doc).
	RootPartition, ESPPartition int
	// NodeAgent, when set, is the bcd the deploy installs into the root (see
	// installNodeAgent); nil means the image ships its own.
	NodeAgent *NodeAgent
}

// NodeAgent is a release's bcd binary for this machine: fetched through the
// image's proxy and checked against SHA256 before anything is written.
type NodeAgent struct {
	Version, URL, SHA256 string
	Size                 int64
}

// Image says where the image is and what its served bytes must be.
type Image struct {
	// URL is https (http only with Deployer.AllowHTTP); its userinfo and query
	// are never echoed in errors.
	URL string
	// SHA256 is lowercase hex over the bytes as served.
	SHA256 string
	// Size is the served length in bytes.
	Size int64
	// Format is raw, raw.gz, raw.xz, raw.zst or qcow2 (protocol.Format*); empty
	// means tell from the stream's first bytes.
	Format string
	// ImageSize is the length once decompressed: required for a compressed
	// format, equal to Size or zero for raw; for qcow2, zero or the header's
	// virtual size.
	ImageSize int64
}

// Target selects the disk: by Serial, by Path, or, with neither, the smallest
// non-removable disk at least as large as the image.
type Target struct {
	Serial, Path string
}

// File is one file to write into the installed OS.
type File struct {
	// FS is protocol.FSRoot (the default) or protocol.FSESP.
	FS string
	// Path is absolute within that filesystem; directories are created as needed.
	Path string
	// Mode (permission bits), UID and GID apply in the root filesystem.
	Mode     uint32
	UID, GID int
	Content  Content
}

// Content is a file's bytes. It prints as its length only: a join token in a
// request never reaches a log through %v.
type Content []byte

// String says how long the content is, never what it is.
func (c Content) String() string { return fmt.Sprintf("[%d bytes]", len(c)) }

// GoString is String, for %#v.
func (c Content) GoString() string { return c.String() }

// After is what happens once the disk is written and checked. For kexec the
// kernel, initrd and command line are found in the image unless given here.
type After struct {
	// Action is protocol.AfterNone (the default: a deploy.image an operator
	// sends by hand leaves the ramdisk up), AfterKexec, AfterReboot or
	// AfterPowerOff. A deployment always names its action
	// (apitype.DeployCreate.Normalize defaults it to kexec: a deployment ends
	// with the installed OS running).
	Action string
	// Kernel and Initrd are paths in FS (root by default).
	Kernel, Initrd, FS string
	Cmdline            string
}

// Validate checks the request as protocol.DeployImageParams.Validate checks
// deploy.image's params: the rules have one home, the wire type's, because the
// control plane checks the same params before it sends them.
func (r *Request) Validate() error {
	p := protocol.DeployImageParams{
		Image:  protocol.DeployImage(r.Image),
		Target: protocol.DeployTarget(r.Target),
		After:  protocol.DeployAfter(r.After),
		Proxy:  r.Proxy, RootPartition: r.RootPartition, ESPPartition: r.ESPPartition,
	}
	if r.NodeAgent != nil {
		p.NodeAgent = (*protocol.DeployNodeAgent)(r.NodeAgent)
	}
	for _, f := range r.Files {
		p.Files = append(p.Files, protocol.DeployFile{FS: f.FS, Path: f.Path, Mode: protocol.FileMode(f.Mode),
			UID: f.UID, GID: f.GID, Content: protocol.FileContent(f.Content)})
	}
	return p.Validate()
}

// Validate checks the action, the paths and the command line.
func (a After) Validate() error {
	w := protocol.DeployAfter(a)
	return w.Validate()
}
