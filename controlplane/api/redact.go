package api

import (
	"encoding/base64"
	"encoding/json"

	"github.com/better-compute/bcd/controlplane/store"
)

// RedactCommand returns c as the api shows it: the content of every file in
// its params (a deploy.image's config, join token and node id) replaced by
// content_redacted and content_bytes. The agent gets the params whole; an
// operator reading the command back never sees the join token.
func RedactCommand(c store.Command) store.Command {
	c.Params = redactParams(c.Params)
	return c
}

func redactParams(params json.RawMessage) json.RawMessage {
	if len(params) == 0 {
		return params
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(params, &obj); err != nil {
		// Params that are not an object cannot be shown safely.
		return nil
	}
	raw, ok := obj["files"]
	if !ok {
		return params
	}
	var files []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &files); err != nil {
		delete(obj, "files")
	} else {
		for _, f := range files {
			c, ok := f["content"]
			if !ok {
				continue
			}
			delete(f, "content")
			var b64 string
			n := -1
			if json.Unmarshal(c, &b64) == nil {
				if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
					n = len(b)
				}
			}
			f["content_redacted"] = json.RawMessage("true")
			if n >= 0 {
				f["content_bytes"], _ = json.Marshal(n)
			}
		}
		obj["files"], _ = json.Marshal(files)
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil
	}
	return out
}
