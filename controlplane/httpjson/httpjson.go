package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/protocol"
)

// Errorf makes a refusal with code.
func Errorf(code, format string, args ...any) *protocol.ErrorResponse {
	return &protocol.ErrorResponse{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unavailable is a retryable server-side failure. The cause is logged, not
// sent: it may name files or queries the caller has no business seeing.
func Unavailable(msg string) *protocol.ErrorResponse {
	return &protocol.ErrorResponse{Code: protocol.CodeUnavailable, Message: msg, Retryable: true}
}

// Status is the HTTP status of a refusal code.
func Status(code string) int {
	switch code {
	case protocol.CodeInvalidInput, protocol.CodeInvalidConfig:
		return http.StatusBadRequest
	case protocol.CodeUnauthenticated, protocol.CodeTokenUnknown, protocol.CodeNonceUnknown:
		return http.StatusUnauthorized
	case protocol.CodeTokenUsed, protocol.CodeTokenExpired, protocol.CodeTokenRevoked,
		protocol.CodeWrongRole, protocol.CodeWrongSite, protocol.CodeWrongPool,
		protocol.CodeAttestorRefused, protocol.CodeAttestorNotAllowed, protocol.CodeNodeRevoked, protocol.CodeCertReplaced,
		protocol.CodeNonceUsed, protocol.CodeNonceExpired, protocol.CodeNonceWrongMAC, protocol.CodeMachineNotRegistered:
		return http.StatusForbidden
	case protocol.CodeReclaimNotAllowed, protocol.CodeAlreadyExists, protocol.CodeMachineBusy:
		return http.StatusConflict
	case protocol.CodeNotFound:
		return http.StatusNotFound
	case protocol.CodeUnsupported:
		return http.StatusUnprocessableEntity
	case protocol.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	if strings.HasPrefix(code, "RELEASE_") {
		// A release refused (untrusted, expired, mismatched, incomplete):
		// well formed, not acceptable.
		return http.StatusUnprocessableEntity
	}
	return http.StatusInternalServerError
}

// WriteJSON writes v with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(&protocol.ErrorResponse{Code: protocol.CodeInternal, Message: "encoding the answer failed"})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// Response is err as the edges answer it: a domain refusal
// (refusal.Refusal) or a protocol.ErrorResponse as it is; nil for any other
// error, which the caller logs and answers as Unavailable.
func Response(err error) *protocol.ErrorResponse {
	if r := refusal.As(err); r != nil {
		return &protocol.ErrorResponse{Code: r.Code, Message: r.Message, Retryable: r.Retryable}
	}
	var e *protocol.ErrorResponse
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// WriteError writes err as a protocol.ErrorResponse (see Response). Any
// other error is logged and answered as a retryable UNAVAILABLE.
func WriteError(w http.ResponseWriter, log *slog.Logger, err error) {
	e := Response(err)
	if e == nil {
		if log != nil {
			log.Error("request failed", "err", err)
		}
		e = Unavailable("the control plane could not complete the request; try again")
	}
	WriteJSON(w, Status(e.Code), e)
}

// Decode reads a JSON body of at most limit bytes into v, refusing unknown
// fields and trailing data, as INVALID_INPUT.
func Decode(r io.Reader, limit int64, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return Errorf(protocol.CodeInvalidInput, "reading the request body: %v", err)
	}
	if int64(len(data)) > limit {
		return Errorf(protocol.CodeInvalidInput, "request body is larger than %d bytes", limit)
	}
	return DecodeBytes(data, v)
}

// DecodeBytes is Decode over a body already read.
func DecodeBytes(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(protocol.CodeInvalidInput, "request body: %v", err)
	}
	if dec.More() {
		return Errorf(protocol.CodeInvalidInput, "request body: data after the JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(protocol.CodeInvalidInput, "request body: data after the JSON value")
	}
	return nil
}
