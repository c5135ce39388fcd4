package kmod

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

func TestDecompressModules(t *testing.T) {
	plain := bytes.Repeat([]byte("\x7fELF not really a module "), 1000)
	dir := t.TempDir()
	for ext, compress := range map[string]func(io.Writer) (io.WriteCloser, error){
		".ko.xz":  func(w io.Writer) (io.WriteCloser, error) { return xz.NewWriter(w) },
		".ko.zst": func(w io.Writer) (io.WriteCloser, error) { return zstd.NewWriter(w) },
		".ko.gz":  func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil },
	} {
		var buf bytes.Buffer
		w, err := compress(&buf)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(plain)
		w.Close()
		p := filepath.Join(dir, "mod"+ext)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decompress(f)
		f.Close()
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("%s: %d bytes, %v", ext, len(got), err)
		}
	}
	// A corrupt archive is an error, not a module.
	p := filepath.Join(dir, "bad.ko.xz")
	os.WriteFile(p, []byte("not xz"), 0o644)
	f, _ := os.Open(p)
	defer f.Close()
	if _, err := decompress(f); err == nil {
		t.Error("a corrupt .ko.xz decompressed")
	}
}
