package downloads

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Blob is one stored file.
type Blob interface {
	io.ReadSeeker
	io.Closer
	ModTime() time.Time
}

// BlobStore holds release files by key ({product}/{version}/{file}).
type BlobStore interface {
	// Open returns the blob under key, or an error wrapping fs.ErrNotExist
	// when there is none.
	Open(ctx context.Context, key string) (Blob, error)
}

// Options configures the handler. At least one of Dir and Blob is required.
type Options struct {
	// BasePath is the prefix of the route, "" or like "/p" (no trailing /).
	BasePath string
	// Dir holds release files directly: {dir}/{file}.
	Dir string
	// Blob is tried first, under {product}/{version}/{file}.
	Blob BlobStore
	// Logger reports errors other than a missing file; nil discards them.
	Logger *slog.Logger
}

// Products served, and what each answers for {version}, {os} and {arch}:
// goreleaser's names, which carry the version without its leading v
// (bcd_0.1.0_linux_amd64 for a v0.1.0 tag).
var products = map[string]func(version, goos, arch string) string{
	"bcd":      func(v, o, a string) string { return pki.BinaryName("bcd", v, o, a) },
	"bcx-ipmi": func(v, o, a string) string { return pki.ArchiveName("bcx-ipmi", v, o, a) },
}

// semver is semver.org's pattern with an optional leading v. Its alphabet
// has no /, %, or \, and a . only between identifiers, so a match cannot
// name a path outside the release files.
var semver = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

var platforms = map[string]bool{"linux-amd64": true, "linux-arm64": true}

// maxVersionLen bounds the version segment: no release needs more, and it
// keeps the regexp's work small.
const maxVersionLen = 128

type handler struct {
	prefix string
	dir    string
	blob   BlobStore
	log    *slog.Logger
}

// New returns the downloads handler. It answers requests whose path starts
// with {BasePath}/downloads/ and 404s everything else.
func New(o Options) (http.Handler, error) {
	if o.Dir == "" && o.Blob == nil {
		return nil, &protocol.ErrorResponse{Code: protocol.CodeInvalidConfig,
			Message: "downloads needs a directory or a blob store (downloads.dir or downloads.blob)"}
	}
	if o.BasePath != "" && (!strings.HasPrefix(o.BasePath, "/") || strings.HasSuffix(o.BasePath, "/")) {
		return nil, &protocol.ErrorResponse{Code: protocol.CodeInvalidConfig,
			Message: fmt.Sprintf("base path %q: want empty or /… without a trailing /", o.BasePath)}
	}
	if o.Dir != "" {
		fi, err := os.Stat(o.Dir)
		if err != nil {
			return nil, &protocol.ErrorResponse{Code: protocol.CodeInvalidConfig, Message: fmt.Sprintf("downloads directory: %v", err)}
		}
		if !fi.IsDir() {
			return nil, &protocol.ErrorResponse{Code: protocol.CodeInvalidConfig, Message: fmt.Sprintf("downloads directory %s is not a directory", o.Dir)}
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &handler{prefix: o.BasePath + "/downloads/", dir: o.Dir, blob: o.Blob, log: log}, nil
}

// Route is a parsed download path.
type Route struct {
	// Version is the URL's version without one leading v: v0.1.0 and 0.1.0
	// name the same release files.
	Product, Version, OS, Arch string
	// File is the release file's name.
	File string
}

// Key is the blob store key.
func (r Route) Key() string { return r.Product + "/" + r.Version + "/" + r.File }

// ParsePath matches the part of an escaped request path after
// {basePath}/downloads/. It works on the escaped form so that %2f, %2e and
// friends never match.
func ParsePath(rest string) (Route, bool) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return Route{}, false
	}
	name, version, platform := parts[0], parts[1], parts[2]
	file, ok := products[name]
	if !ok || !platforms[platform] || len(version) > maxVersionLen || !semver.MatchString(version) {
		return Route{}, false
	}
	goos, arch, _ := strings.Cut(platform, "-")
	version = strings.TrimPrefix(version, "v")
	return Route{Product: name, Version: version, OS: goos, Arch: arch, File: file(version, goos, arch)}, true
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), h.prefix)
	if !ok || r.URL.RawQuery != "" {
		http.NotFound(w, r)
		return
	}
	route, ok := ParsePath(rest)
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, err := h.open(r.Context(), route)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			h.log.Error("downloads: open", "file", route.File, "err", err)
		}
		http.NotFound(w, r)
		return
	}
	defer b.Close()
	hdr := w.Header()
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Cache-Control", "public, max-age=31536000, immutable")
	hdr.Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, route.File, b.ModTime(), b)
}

func (h *handler) open(ctx context.Context, route Route) (Blob, error) {
	if h.blob != nil {
		b, err := h.blob.Open(ctx, route.Key())
		if err == nil || !errors.Is(err, fs.ErrNotExist) || h.dir == "" {
			return b, err
		}
	}
	return openRegular(h.dir, route.File)
}

// DirBlobs is a BlobStore over a directory tree: key a/b/c is the file
// {root}/a/b/c. Keys stay inside root (os.Root), and only a regular file is
// opened, never through a symlink at its own name.
type DirBlobs string

// Open implements BlobStore.
func (d DirBlobs) Open(_ context.Context, key string) (Blob, error) {
	return openRegular(string(d), key)
}

// openRegular opens name beneath dir as a regular file, refusing a symlink
// at name, an escape from dir, and anything but a regular file, each as
// fs.ErrNotExist: to a client they are all just not there. A regular file with
// more than one link is refused with secretfile.ErrLinks, which the handler logs.
func openRegular(dir, name string) (Blob, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: %w", name, fs.ErrNotExist)
	}
	// O_NOFOLLOW closes the gap between Lstat and open (a file swapped for
	// a symlink); O_NONBLOCK keeps a FIFO put there meanwhile from hanging.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}
	fi2, err := f.Stat()
	if err != nil || !fi2.Mode().IsRegular() || !os.SameFile(fi, fi2) {
		f.Close()
		return nil, fmt.Errorf("%s changed while it was opened: %w", name, fs.ErrNotExist)
	}
	// os.Root confines the name, not the file: a hard link under dir may be any
	// file of the host. Not fs.ErrNotExist, so that the handler logs it (the
	// client still sees 404).
	if err := secretfile.OneLink(name, fi2); err != nil {
		f.Close()
		return nil, err
	}
	return fileBlob{f, fi2.ModTime()}, nil
}

type fileBlob struct {
	*os.File
	mod time.Time
}

func (b fileBlob) ModTime() time.Time { return b.mod }
