// Package updatetest signs test releases of bcd and serves their binaries over
// HTTPS on 127.0.0.1, for the tests of self-update in the daemons
// (agent/daemonupdate, internal/e2e). The releases are real: pki.SignRelease
// under a fresh release key whose pin the test puts in [update] release_pins.
package updatetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Releaser is a release key and the HTTPS server its binaries are served from.
type Releaser struct {
	// Key signs the manifests; Pin is its pin, for [update] release_pins.
	Key *ecdsa.PrivateKey
	Pin string
	// Server serves each binary at /bcd/<version>.
	Server *httptest.Server

	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
}

// New makes a release key and starts the server with start (a TLS server on
// 127.0.0.1: httptest.NewTLSServer, or agenttest's Gateway.API for a
// certificate from the control plane's serving CA).
func New(t testing.TB, start func(testing.TB, http.Handler) *httptest.Server) *Releaser {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pin, err := pki.SPKIPin(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	r := &Releaser{Key: k, Pin: pin, files: map[string][]byte{}, hits: map[string]int{}}
	r.Server = start(t, http.HandlerFunc(r.serve))
	return r
}

// TLSServer is a start for New: httptest's own TLS server, which the server's
// Client trusts.
func TLSServer(t testing.TB, h http.Handler) *httptest.Server {
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func (r *Releaser) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	body, ok := r.files[req.URL.Path]
	if ok {
		r.hits[req.URL.Path]++
	}
	r.mu.Unlock()
	if !ok {
		http.NotFound(w, req)
		return
	}
	_, _ = w.Write(body)
}

// Downloads is how often the binary of version was served.
func (r *Releaser) Downloads(version string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits["/bcd/"+version]
}

// Section serves body as bcd version and returns the daemon section for it:
// a manifest with sequence seq signed by Key, unexpired for an hour, listing
// the binary for this platform. edit, when given, may change the release
// before it is signed (another digest, an expiry in the past).
func (r *Releaser) Section(t testing.TB, version string, seq int64, body []byte, edit ...func(*pki.Release)) protocol.DaemonSection {
	t.Helper()
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	rel := pki.Release{
		Product: "bcd", Version: version, Sequence: seq, Expires: time.Now().Add(time.Hour),
		Artifacts: []pki.Artifact{{Name: pki.BinaryName("bcd", version, runtime.GOOS, runtime.GOARCH), Size: int64(len(body)), SHA256: digest}},
	}
	for _, e := range edit {
		e(&rel)
	}
	manifest, err := pki.SignRelease(rel, []*ecdsa.PrivateKey{r.Key})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.files["/bcd/"+version] = body
	r.mu.Unlock()
	return protocol.DaemonSection{Version: version, URL: r.Server.URL + "/bcd/" + version, SHA256: digest, Signature: string(manifest)}
}
