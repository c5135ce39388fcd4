package bmcplugin

import (
	"encoding/json"

	"google.golang.org/grpc/encoding"
)

// codecName is the gRPC content subtype of the driver service's messages.
const codecName = "bcd-json"

type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (jsonCodec) Name() string                       { return codecName }

func init() {
	// A server picks the codec by the content subtype a call names, so go-plugin's
	// own protobuf services are unaffected.
	encoding.RegisterCodec(jsonCodec{})
}
