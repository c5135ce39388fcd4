// Package refusal is how the control plane's domain packages (lifecycle,
// join, machines) say no: a Refusal carries one of the protocol's codes
// (protocol.CodeInvalidInput, CodeNotFound, …) and a message for the
// operator or agent, and nothing of HTTP. Only the edges (the api and the
// gateway, through httpjson) turn one into a status code and a body.
package refusal

import (
	"errors"
	"fmt"

	"github.com/better-compute/bcd/protocol"
)

// Refusal is a request the control plane turns down, with the reason.
type Refusal struct {
	// Code is one of the protocol's error codes.
	Code string
	// Message says what is wrong and, where there is one, what to do.
	Message string
	// Retryable says the same request may succeed later.
	Retryable bool
}

func (r *Refusal) Error() string { return r.Code + ": " + r.Message }

// New makes a refusal with code.
func New(code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unavailable is a retryable refusal: the control plane cannot do it now.
func Unavailable(msg string) *Refusal {
	return &Refusal{Code: protocol.CodeUnavailable, Message: msg, Retryable: true}
}

// As returns the refusal in err's chain, or nil.
func As(err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	return nil
}
