package join

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/internal/secretfile"
)

// MaxTokenSize bounds a join token from any source. A bcjt_ token is well under
// 100 bytes; the limit only stops a wrong file or stream from being read whole.
const MaxTokenSize = 4 << 10

// EnvToken is the environment variable bcd join reads the token from.
const EnvToken = "BCD_JOIN_TOKEN"

// ErrNoToken means no source held a token.
var ErrNoToken = errors.New("no join token: set " + EnvToken + ", pipe the token on standard input, or give --token-file")

// TokenSource is where a join token may come from, in the order Read tries them.
// Only one of File and Env may be set: two tokens given two ways is a mistake to
// report, not to resolve silently.
type TokenSource struct {
	// File is --token-file.
	File string
	// Env is the value of BCD_JOIN_TOKEN.
	Env string
	// Stdin is read when neither is set and it is not a terminal.
	Stdin io.Reader
}

// Read returns the token and a description of where it came from (never the token).
func (s TokenSource) Read() (token, from string, err error) {
	switch {
	case s.File != "" && s.Env != "":
		return "", "", fmt.Errorf("both %s and --token-file are set; give the token one way", EnvToken)
	case s.File != "":
		tok, err := ReadTokenFile(s.File)
		return tok, "--token-file " + s.File, err
	case s.Env != "":
		tok, err := ParseToken([]byte(s.Env))
		if err != nil {
			return "", "", fmt.Errorf("%s: %w", EnvToken, err)
		}
		return tok, EnvToken, nil
	case s.Stdin != nil && !agent.IsTerminal(s.Stdin):
		data, err := io.ReadAll(io.LimitReader(s.Stdin, MaxTokenSize+1))
		if err != nil {
			return "", "", fmt.Errorf("read the join token from standard input: %w", err)
		}
		if len(data) > MaxTokenSize {
			return "", "", fmt.Errorf("standard input holds more than %d bytes; a join token is one short line", MaxTokenSize)
		}
		if len(strings.TrimSpace(string(data))) == 0 {
			return "", "", ErrNoToken
		}
		tok, err := ParseToken(data)
		if err != nil {
			return "", "", fmt.Errorf("standard input: %w", err)
		}
		return tok, "standard input", nil
	}
	return "", "", ErrNoToken
}

// ParseToken trims surrounding whitespace and checks that what is left is one word
// of printable ASCII. Errors never quote the input: it is a secret.
func ParseToken(data []byte) (string, error) {
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", errors.New("the join token is empty")
	}
	if len(tok) > MaxTokenSize {
		return "", fmt.Errorf("the join token is longer than %d bytes", MaxTokenSize)
	}
	for i := 0; i < len(tok); i++ {
		if b := tok[i]; b <= ' ' || b >= 0x7f {
			return "", fmt.Errorf("the join token has a space, control or non-ASCII character at byte %d; want one word", i)
		}
	}
	return tok, nil
}

// ReadTokenFile reads --token-file. Before reading a byte it requires the file to be
// its owner's alone:
//
//   - a regular file (a directory, FIFO, socket or device is refused, and opening
//     never blocks on a FIFO);
//   - mode 0600 or 0400;
//   - at most MaxTokenSize bytes;
//   - reached without leaving its directory: symbolic links are followed only when
//     they stay inside the directory holding the path, which is how a Kubernetes
//     Secret volume links token -> ..data/token -> ..<timestamp>/token.
func ReadTokenFile(path string) (string, error) {
	dir, base := filepath.Split(path)
	if base == "" {
		return "", fmt.Errorf("--token-file %s: not a file name", path)
	}
	if dir == "" {
		dir = "."
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	defer root.Close()
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
	f, err := root.OpenFile(base, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return "", fmt.Errorf("--token-file %s: %w", path, err)
		}
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("--token-file %s: a symbolic link may only point within its own directory %s (as a Kubernetes Secret's ..data link does): %w", path, dir, err)
		}
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	defer f.Close()
	// checkTokenFile's refusals name the flag and path already; the rest are
	// secretfile's, which name the path.
	var refused error
	data, err := secretfile.ReadFrom(f, path, secretfile.Options{Limit: MaxTokenSize, Check: func(fi fs.FileInfo) error {
		refused = checkTokenFile(path, fi)
		return refused
	}})
	if err != nil {
		if err == refused {
			return "", err
		}
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok, err := ParseToken(data)
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	return tok, nil
}

func checkTokenFile(path string, fi fs.FileInfo) error {
	switch m := fi.Mode(); {
	case m.IsDir():
		return fmt.Errorf("--token-file %s: is a directory; want a regular file", path)
	case !m.IsRegular():
		return fmt.Errorf("--token-file %s: is not a regular file (%s); want a regular file", path, secretfile.Kind(m))
	}
	if perm := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky); perm != 0o600 && perm != 0o400 {
		return fmt.Errorf("--token-file %s: mode %04o; the file must be its owner's alone, mode 0600 or 0400 (chmod 600 %s)", path, uint32(perm.Perm()), path)
	}
	if fi.Size() > MaxTokenSize {
		return fmt.Errorf("--token-file %s: %d bytes, over the %d-byte limit; a join token file holds one short line", path, fi.Size(), MaxTokenSize)
	}
	return nil
}

// RemoveTokenFile deletes a used token file: a token is single use, and one left on
// disk only invites mistakes. On a read-only mount (a Kubernetes Secret volume) the
// file cannot go; readOnly reports that case, which the caller logs as a warning.
func RemoveTokenFile(path string) (readOnly bool, err error) {
	err = os.Remove(path)
	switch {
	case err == nil, errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, syscall.EROFS):
		return true, nil
	}
	return false, fmt.Errorf("delete the used token file %s: %w", path, err)
}
