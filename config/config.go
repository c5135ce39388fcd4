package config

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/internal/secretfile"
)

const (
	// DefaultPath is where the daemons look for their configuration.
	DefaultPath = "/etc/bcd/config.toml"
	// MaxSize is the largest file Load and Parse accept.
	MaxSize = 64 << 10
	// ErrorCode is the code callers report a bad configuration under.
	ErrorCode = "INVALID_CONFIG"
)

// Config is the whole file. A nil section was absent.
type Config struct {
	GatewayURL           string
	Site                 string
	ServingCASPKIPin     string
	JoinSigningKeyPin    string
	JoinEncryptionKeyPin string
	DataDir              string
	SocketPath           string
	GatewayServerName    string

	Boot    *Boot
	Plugins *Plugins
	Helper  *Helper
	Update  *Update
	Journal *Journal
	Log     *Log
	IMDS    *IMDS
	Host    *Host
	Metrics *Metrics
}

// Boot is [boot], the site agent's PXE boot server.
type Boot struct {
	Listen     string
	URL        string
	Kernel     string
	Initrd     string
	Cmdline    string
	ServerIP   string
	ProxyDHCP  bool
	TFTP       string
	TFTPRoot   string
	Interface  string
	RamdiskDir string

	// TFTPMaxTransfers bounds the TFTP transfers running at once (a request
	// beyond is left for the client to send again); 0: the server's default.
	TFTPMaxTransfers int64
	// TFTPTransferTimeout bounds a TFTP transfer's life, in seconds; 0: the
	// server's default.
	TFTPTransferTimeout int64
	// TrustAnyNeighbor hands boot nonces and witnesses without the neighbour
	// table check: for simulations (bcd sim), whose machines share one MAC.
	TrustAnyNeighbor bool
}

// Plugins is [plugins], the bcx plugins a node runs.
type Plugins struct {
	Dir        string
	Cgroup     string
	Privileged []string
	MemoryMax  int64
	PidsMax    int64
}

// Helper is [helper]: bcd node runs unprivileged beside a root bcd helper.
type Helper struct {
	Socket          string
	User            string
	InstanceBridges []string
}

// Update is [update], what self-update trusts.
type Update struct {
	ReleasePins      []string
	ReleaseThreshold int64
	ReleaseSequence  int64
	SlotsDir         string
	Entrypoint       string
}

// Journal is [journal], the store of unacknowledged statuses.
type Journal struct {
	Path       string
	MaxEntries int64
}

// Log is [log].
type Log struct {
	Level  string
	Format string
}

// IMDS is [imds], the instance metadata service.
type IMDS struct {
	Enabled bool
	Listen  string
}

// Host is [host], what the helper may do to the host for the node.
type Host struct {
	Units             []string
	CommandRootSHA256 string
}

// Metrics is [metrics]: bcd site serves Prometheus metrics on
// http://Listen/metrics. Absent, it serves none; bcd node never does (it
// ignores the section, which a host's shared config.toml may carry).
type Metrics struct {
	Listen string
}

// ParseOptions changes what Parse accepts.
type ParseOptions struct {
	// AllowHTTP accepts an http:// gateway_url, for development builds.
	AllowHTTP bool
}

// Error is one problem in a configuration file. Line is 0 for a problem
// with the whole file.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Msg
	case e.File != "":
		return e.File + ": " + e.Msg
	case e.Line > 0:
		return "line " + strconv.Itoa(e.Line) + ": " + e.Msg
	}
	return e.Msg
}

// Code is ErrorCode: a bad file is the caller's mistake, not a failure.
func (e *Error) Code() string { return ErrorCode }

// ErrorList is every problem in a file, sorted by line.
type ErrorList []*Error

func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Code is ErrorCode.
func (l ErrorList) Code() string { return ErrorCode }

// Unwrap lets errors.As find an *Error in the list.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// IsInvalid reports whether err is about the file's content rather than
// reading it.
func IsInvalid(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

var errTooLarge = fmt.Sprintf("file is larger than %d bytes (64 KiB)", MaxSize)

// Parse reads a configuration file. A bad document gives an ErrorList.
func Parse(data []byte, opts ParseOptions) (*Config, error) {
	if len(data) > MaxSize {
		return nil, ErrorList{{Msg: errTooLarge}}
	}
	doc, errs := parseDocument(data)
	c := new(Config)
	errs = append(errs, decode(c, doc, opts)...)
	if len(errs) > 0 {
		sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
		return nil, errs
	}
	return c, nil
}

// Load reads and parses the file at path, reading no more than it can accept.
// Anything but a regular file (a FIFO, a directory, a device) is refused before a
// byte is read, naming the path and what it is: opening never waits on a FIFO.
func Load(path string, opts ParseOptions) (*Config, error) {
	data, err := secretfile.Read(path, secretfile.Options{Limit: MaxSize})
	if errors.Is(err, secretfile.ErrTooLarge) {
		return nil, ErrorList{{File: path, Msg: errTooLarge}}
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data, opts)
	var list ErrorList
	if errors.As(err, &list) {
		for _, e := range list {
			e.File = path
		}
	}
	return c, err
}

// MaxCheckProblems is how many problems Check prints before it only counts the
// rest, as compilers and linters stop (gcc, go vet and eslint print tens to a
// hundred): a file of 9,000 bad sections printed 566 KB, which hides the first
// problem, the one to fix, as well as none at all.
const MaxCheckProblems = 100

// Check loads path and writes OK, or each problem as FILE:LINE: message, the
// first MaxCheckProblems of them and then how many more there are.
// It is `bcd config check`, which an operator runs before a restart.
func Check(path string, opts ParseOptions, w io.Writer) bool {
	_, err := Load(path, opts)
	var list ErrorList
	switch {
	case err == nil:
		fmt.Fprintln(w, "OK")
	case errors.As(err, &list):
		for i, e := range list {
			if i == MaxCheckProblems {
				fmt.Fprintf(w, "%s: %d more problems not shown (%d in all); fix the first ones and run bcd config check again\n",
					path, len(list)-i, len(list))
				break
			}
			fmt.Fprintln(w, e)
		}
	default:
		fmt.Fprintln(w, err)
	}
	return err == nil
}
