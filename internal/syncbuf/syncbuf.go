// Package syncbuf is a bytes.Buffer that many goroutines may write while a test
// reads it (the log of a server, the output of a process, a console), and Tail,
// which keeps only the last bytes written (a child's stderr for its error).
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

// Tail is an io.Writer that keeps the last Max bytes written to it (a
// process's stderr, for the error that says why it ended), readable while
// others write.
type Tail struct {
	Max int

	mu sync.Mutex
	b  []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.Max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.Max:]...)
	}
	return len(p), nil
}

// String returns the last Max bytes written.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
