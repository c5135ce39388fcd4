// Package syncbuf is a bytes.Buffer that many goroutines may write while a test
// reads it: the log of a server, the output of a process, a console.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer whose String may be read while others write.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
