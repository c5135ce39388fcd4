package deploy

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/better-compute/bcd/protocol"
)

const (
	reasonInvalid        = protocol.DeployReasonInvalid
	reasonNotImplemented = protocol.DeployReasonNotImplemented
	reasonNoDisk         = protocol.DeployReasonNoDisk
	reasonDownload       = protocol.DeployReasonDownload
	reasonDigest         = protocol.DeployReasonDigest
	reasonSize           = protocol.DeployReasonSize
	reasonDecompress     = protocol.DeployReasonDecompress
	reasonWrite          = protocol.DeployReasonWrite
	reasonPartitions     = protocol.DeployReasonPartitions
	reasonFiles          = protocol.DeployReasonFiles
	reasonKernel         = protocol.DeployReasonKernel
	reasonCancelled      = protocol.DeployReasonCancelled
	reasonTool           = protocol.DeployReasonTool
)

// Error is a failed deploy: Reason is one of protocol.DeployReason*, for the
// command's Status.Reason; the message says what went wrong in words.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Reason returns the protocol.DeployReason* of err, or write-failed for an error
// that carries none.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return reasonWrite
}

// failf makes an *Error. A missing tool anywhere in args wins over reason: the
// operator's fix is the ramdisk image, not the params.
func failf(reason, format string, args ...any) error {
	for _, a := range args {
		var e *Error
		if err, ok := a.(error); ok && errors.As(err, &e) && e.Reason == reasonTool {
			reason = reasonTool
		}
	}
	return &Error{Reason: reason, Err: fmt.Errorf("deploy: "+format, args...)}
}

// StreamError is an image that did not arrive as promised: it says what was
// expected and what came, so an operator can tell a bad mirror from a bad digest.
type StreamError struct {
	// URL is the image URL without userinfo, query or fragment.
	URL string
	// What went wrong, in words: "sha256 mismatch", "truncated", ….
	Problem        string
	ExpectedSHA256 string
	// ActualSHA256 is over the Received bytes.
	ActualSHA256 string
	Received     int64
	ExpectedSize int64
	Err          error
}

func (e *StreamError) Error() string {
	var s string
	if e.ActualSHA256 == "" {
		s = fmt.Sprintf("deploy: image %s: %s (sha256 expected %s; nothing received)", e.URL, e.Problem, e.ExpectedSHA256)
	} else {
		s = fmt.Sprintf("deploy: image %s: %s (sha256 expected %s, got %s over the %d of %d bytes received)",
			e.URL, e.Problem, e.ExpectedSHA256, e.ActualSHA256, e.Received, e.ExpectedSize)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *StreamError) Unwrap() error { return e.Err }

// stripURLError unwraps net/http's *url.Error, whose message repeats the whole URL
// with its query.
func stripURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
