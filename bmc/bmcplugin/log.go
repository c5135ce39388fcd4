package bmcplugin

import (
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Loggers returns the two loggers a plugin uses, both writing JSON lines to w (its
// stderr) in the shape go-plugin's host parses, so bcd logs each line at its level
// with its attributes: slog for the driver, hclog for go-plugin's server.
func Loggers(w io.Writer, name string) (*slog.Logger, hclog.Logger) {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				// The one layout go-plugin's host accepts.
				return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
			case slog.LevelKey:
				return slog.String("@level", strings.ToLower(a.Value.String()))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	})
	hl := hclog.New(&hclog.LoggerOptions{Name: name, Output: w, JSONFormat: true, Level: hclog.Info, TimeFormat: time.RFC3339})
	return slog.New(h).With("@module", name), hl
}
