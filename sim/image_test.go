package sim

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// TestPatternReader: read in chunks of any size, the image is the pattern
// byte for byte (every fourth 4 KiB block starts with its offset's bytes).
func TestPatternReader(t *testing.T) {
	const size = 5*4096*4 + 123
	want := make([]byte, size)
	for o := range want {
		if (o/4096)%4 == 0 && o%4096 < 8 {
			want[o] = byte(int64(o) >> (8 * (o % 8)))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		r := &patternReader{left: size}
		var got bytes.Buffer
		buf := make([]byte, 1+rng.IntN(9000))
		for {
			n, err := r.Read(buf[:1+rng.IntN(len(buf))])
			got.Write(buf[:n])
			if err == io.EOF {
				break
			}
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("the pattern read in chunks of up to %d bytes differs from the reference", len(buf))
		}
	}
}

func BenchmarkPatternReader(b *testing.B) {
	buf := make([]byte, 32<<10)
	b.SetBytes(8 << 20)
	for b.Loop() {
		io.CopyBuffer(io.Discard, &patternReader{left: 8 << 20}, buf)
	}
}
