// Package httpjson is how the control plane's HTTP handlers read and write
// JSON: strict decoding with a size limit, and refusals as
// protocol.ErrorResponse with the HTTP status that goes with each code.
package httpjson
