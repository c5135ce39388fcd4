package gateway

import (
	"encoding/json"
	"testing"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/protocol"
)

// FuzzDecodeFrame feeds the gateway's frame decoding what an agent could
// send: it must refuse or decode, never panic, and a decoded status, event
// or hello must re-encode.
func FuzzDecodeFrame(f *testing.F) {
	for _, v := range []struct {
		typ string
		v   any
	}{
		{protocol.FrameHello, protocol.Hello{ProtocolVersion: 1, NodeID: "n_1", Role: "node"}},
		{protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: "cmd_1", State: "RUNNING", Progress: &protocol.Progress{Done: 1}}},
		{protocol.FrameEvent, protocol.Event{Seq: 2, Kind: protocol.EventLog, Data: json.RawMessage(`{"a":1}`)}},
	} {
		fr, _ := protocol.NewFrame(v.typ, v.v)
		b, _ := json.Marshal(fr)
		f.Add(b)
	}
	f.Add([]byte(`{"type":"status","data":null}`))
	f.Add([]byte(`{"type":"event","data":{"time":"not a time"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeFrame(websocket.MessageText, data)
		if err != nil {
			return
		}
		var out any
		switch fr.Type {
		case protocol.FrameHello:
			var h protocol.Hello
			if fr.Decode(&h) != nil {
				return
			}
			out = h
		case protocol.FrameStatus:
			var s protocol.Status
			if fr.Decode(&s) != nil {
				return
			}
			out = s
		case protocol.FrameEvent:
			var e protocol.Event
			if fr.Decode(&e) != nil {
				return
			}
			out = e
		default:
			return
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatalf("decoded %s does not re-encode: %v", fr.Type, err)
		}
	})
}

func TestBinaryFramesRefused(t *testing.T) {
	if _, err := decodeFrame(websocket.MessageBinary, []byte(`{"type":"hello"}`)); err == nil {
		t.Error("a binary message was accepted")
	}
}
