package selfupdate

import (
	"errors"
	"fmt"

	"github.com/better-compute/bcd/pki"
)

// Refusal codes bcd adds to pki's RELEASE_* codes. Each names what is wrong
// with the release, the section or the host's files, not a host failure: a
// caller reports a Refusal as the daemon section's ReasonReleaseRefused.
const (
	// CodeNoReleasePins: [update] release_pins is empty, so no binary is taken.
	CodeNoReleasePins = "NO_RELEASE_PINS"
	// CodeSectionInvalid: the daemon section's version or digest is malformed.
	CodeSectionInvalid = "SECTION_INVALID"
	// CodeFailedBefore: the version is in update.json's failed list.
	CodeFailedBefore = "UPDATE_FAILED_BEFORE"
	// CodeInsecureURL: the download URL is not https://.
	CodeInsecureURL = "INSECURE_URL"
	// CodeTooLarge: the manifest lists a binary larger than Options.MaxSize.
	CodeTooLarge = "BINARY_TOO_LARGE"
	// CodeSizeMismatch: the bytes are not the manifest's size.
	CodeSizeMismatch = "SIZE_MISMATCH"
	// CodeDigestMismatch: the bytes do not have the manifest's SHA-256.
	CodeDigestMismatch = "DIGEST_MISMATCH"
	// CodeDownloadFailed: the download did not complete (status, network,
	// the idle watchdog).
	CodeDownloadFailed = "DOWNLOAD_FAILED"
	// CodeStagingRefused: the staged file or its directory is not what the
	// download left there (a symlink, a FIFO, a hard link, the wrong owner).
	CodeStagingRefused = "STAGING_REFUSED"
	// CodeEntrypointRefused: the entrypoint cannot be adopted (a symlink
	// elsewhere, not root's, writable by group or others, missing).
	CodeEntrypointRefused = "ENTRYPOINT_REFUSED"
	// CodeSlotsRefused: the slots directory is not what bcd left there.
	CodeSlotsRefused = "SLOTS_REFUSED"
	// CodeUpdatePending: another update awaits its Welcome.
	CodeUpdatePending = "UPDATE_PENDING"
)

// pki's codes, in the order they are matched.
var releaseCodes = []error{
	pki.ErrReleaseUntrusted, pki.ErrReleaseMismatch, pki.ErrReleaseIncomplete,
	pki.ErrReleaseExpired, pki.ErrReleaseRollback,
}

// Refusal is every error for a release bcd will not take. Code is one of
// pki's RELEASE_UNTRUSTED, RELEASE_MISMATCH, RELEASE_INCOMPLETE,
// RELEASE_EXPIRED, RELEASE_ROLLBACK or one of the Code* constants; Error()
// starts with the code, as protocol.ReasonReleaseRefused asks.
type Refusal struct {
	Code    string
	Message string
	// Err is the cause, when there is one (a pki error for the RELEASE_*
	// codes, so errors.Is(err, pki.ErrReleaseExpired) holds).
	Err error
}

func (r *Refusal) Error() string { return r.Code + ": " + r.Message }
func (r *Refusal) Unwrap() error { return r.Err }

func refuse(code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Message: fmt.Sprintf(format, args...)}
}

// releaseRefusal turns a pki verification error into a Refusal with its code.
// An error that wraps none of pki's codes is the policy's own (a bad pin in
// the config), which is not the release's fault: it stays a plain error.
func releaseRefusal(err error, suffix string) error {
	for _, code := range releaseCodes {
		if errors.Is(err, code) {
			msg := err.Error()
			if p := code.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
				msg = msg[len(p):]
			}
			return &Refusal{Code: code.Error(), Message: msg + suffix, Err: err}
		}
	}
	return fmt.Errorf("selfupdate: %w", err)
}

// IsRefusal returns the Refusal in err's chain.
func IsRefusal(err error) (*Refusal, bool) {
	var r *Refusal
	ok := errors.As(err, &r)
	return r, ok
}
