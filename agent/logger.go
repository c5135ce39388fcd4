package agent

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/better-compute/bcd/config"
)

// NewLogger builds the agent's logger from [log]: JSON lines under a service manager
// (w is not a terminal) or with format "json", text on a terminal or with format
// "text". The level is debug, info, warn or error.
func NewLogger(w io.Writer, l config.Log) (*slog.Logger, error) {
	var level slog.Level
	switch l.Level {
	case "", "info":
		level = slog.LevelInfo
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, fmt.Errorf("[log] level %q: want debug, info, warn or error", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.Format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "", "auto":
		if IsTerminal(w) {
			return slog.New(slog.NewTextHandler(w, opts)), nil
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("[log] format %q: want json, text or auto", l.Format)
}

// IsTerminal reports whether v is an *os.File on a character device (a terminal,
// or /dev/null, which reads as empty either way).
func IsTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
