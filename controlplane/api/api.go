package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/rollouts"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// Token lifetimes.
const (
	DefaultTokenTTL = 24 * time.Hour
	MinTokenTTL     = time.Minute
	MaxTokenTTL     = 365 * 24 * time.Hour
)

// MaxBodySize bounds an operator request body.
const MaxBodySize = 64 << 10

// Notifier is told about what changes a node's session: the gateway.
type Notifier interface {
	// Notify: the node has a new command.
	Notify(nodeID string)
	// Disconnect: the node was deleted.
	Disconnect(nodeID, reason string)
	// SpecChanged: what the site's agents are sent changed.
	SpecChanged(site string)
}

// Lifecycle runs machines' deployments: the lifecycle controller. Its
// refusals are *refusal.Refusal errors.
type Lifecycle = machines.Lifecycle

// Store is what the api reads and writes.
type Store interface {
	store.Sites
	store.Tokens
	store.Nodes
	store.Commands
	store.Operators
	store.Machines
	store.TPMEnrollments
	store.PoolPolicies
	store.Daemons
	store.Releases
	store.Rollouts
	store.Images
	GetDeployment(ctx context.Context, id string) (store.Deployment, error)
}

// machines is the one way the api changes a machine.
func (s *Server) machines() *machines.Service {
	svc := &machines.Service{Store: s.Store, Lifecycle: s.Lifecycle, Logger: s.Logger, Now: s.Now}
	if s.Notifier != nil {
		svc.Notifier = s.Notifier
	}
	return svc
}

// Server is the api.
type Server struct {
	// Store holds everything.
	Store Store
	// WellKnown is served at /.well-known/better-compute.
	WellKnown *protocol.WellKnown
	// Downloads serves {BasePath}/downloads/…; nil leaves the route out.
	Downloads http.Handler
	// BasePath prefixes every route but the root well-known document: "" or
	// like "/p".
	BasePath string
	// Notifier reaches node sessions; nil when none (commands are then
	// delivered at the node's next session).
	Notifier Notifier
	// Lifecycle runs deployments; nil refuses deploy and cancel
	// (UNSUPPORTED).
	Lifecycle Lifecycle
	// Rollouts adds releases, runs rollouts and sends daemon.upgrade; nil
	// refuses them (UNSUPPORTED).
	Rollouts *rollouts.Service
	// DeployBCDVersion is the release a deploy without bcd_version installs
	// (serve --deploy-bcd-version); "" means such a deploy installs none.
	DeployBCDVersion string
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Handler serves every route.
func (s *Server) Handler() http.Handler {
	b := s.BasePath
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+protocol.PathWellKnown, s.wellKnown)
	if b != "" {
		mux.HandleFunc("GET "+b+protocol.PathWellKnown, s.wellKnown)
	}
	op := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		method, path, _ := strings.Cut(pattern, " ")
		mux.Handle(method+" "+b+"/api/v1"+path, s.operator(h))
	}
	op("POST /tokens", s.createToken)
	op("GET /tokens", s.listTokens)
	op("POST /tokens/{id}/revoke", s.revokeToken)
	op("POST /sites", s.createSite)
	op("GET /sites", s.listSites)
	op("POST /images", s.addImage)
	op("GET /images", s.listImages)
	op("GET /images/{name}", s.getImage)
	op("DELETE /images/{name}", s.deleteImage)
	op("GET /nodes", s.listNodes)
	op("GET /nodes/{id}", s.getNode)
	op("DELETE /nodes/{id}", s.deleteNode)
	op("POST /nodes/{id}/cordon", s.cordon(true))
	op("POST /nodes/{id}/uncordon", s.cordon(false))
	op("POST /nodes/{id}/commands", s.createCommand)
	op("GET /commands/{id}", s.getCommand)
	op("PUT /sites/{name}/http-proxy", s.setProxy)
	op("DELETE /sites/{name}/http-proxy", s.clearProxy)
	op("POST /machines", s.createMachine)
	op("GET /machines", s.listMachines)
	op("GET /machines/{ref}", s.getMachine)
	op("DELETE /machines/{ref}", s.deleteMachine)
	op("PUT /machines/{ref}/boot", s.setBoot)
	op("PUT /machines/{ref}/bmc", s.setBMC)
	op("DELETE /machines/{ref}/bmc", s.clearBMC)
	op("POST /machines/{ref}/approve", s.approveMachine)
	op("GET /machines/{ref}/events", s.machineEvents)
	op("POST /machines/{ref}/power", s.power)
	op("POST /machines/{ref}/bootdev", s.bootdev)
	op("POST /machines/{ref}/inventory", s.inventory)
	op("POST /machines/{ref}/deploy", s.deploy)
	op("POST /machines/{ref}/cancel", s.cancel)
	op("PUT /machines/{ref}/firmware", s.setFirmware)
	op("PUT /machines/{ref}/tpm", s.setMachineTPM)
	op("DELETE /machines/{ref}/tpm", s.clearMachineTPM)
	op("POST /tpm/enrollments", s.createEnrollment)
	op("GET /tpm/enrollments", s.listEnrollments)
	op("DELETE /tpm/enrollments/{ek}", s.revokeEnrollment)
	op("GET /pools", s.listPoolPolicies)
	op("GET /pools/{pool}/policy", s.getPoolPolicy)
	op("PUT /pools/{pool}/policy", s.setPoolPolicy)
	op("POST /releases", s.addRelease)
	op("GET /releases", s.listReleases)
	op("POST /rollouts", s.createRollout)
	op("GET /rollouts", s.listRollouts)
	op("GET /rollouts/{id}", s.getRollout)
	op("POST /rollouts/{id}/{action}", s.actOnRollout)
	op("POST /nodes/{id}/upgrade", s.upgradeNode)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteJSON(w, http.StatusNotFound, httpjson.Errorf(protocol.CodeNotFound, "no such route: %s %s", r.Method, human.ShortN(r.URL.Path, 80)))
	})
	downloads := b + "/downloads/"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Downloads bypass the mux, which would answer a path with .. or //
		// with a redirect to the cleaned path: the spec wants a 404.
		if strings.HasPrefix(r.URL.Path, downloads) || strings.HasPrefix(r.URL.EscapedPath(), downloads) {
			if s.Downloads == nil {
				http.NotFound(w, r)
				return
			}
			s.Downloads.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Server) wellKnown(w http.ResponseWriter, r *http.Request) {
	b, err := json.Marshal(s.WellKnown)
	if err != nil {
		httpjson.WriteError(w, s.log(), err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=60")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Write(append(b, '\n'))
}

// operator wraps an operator route: bearer token, JSON errors.
func (s *Server) operator(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authorize(r.Context(), r); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="better-compute"`)
			httpjson.WriteError(w, s.log(), err)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodySize)
		if err := h(w, r); err != nil {
			httpjson.WriteError(w, s.log(), err)
		}
	})
}

func (s *Server) authorize(ctx context.Context, r *http.Request) error {
	auth := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return httpjson.Errorf(protocol.CodeUnauthenticated, "this route needs Authorization: Bearer <operator token> (bcop_…)")
	}
	h, err := token.ParseOperator(strings.TrimSpace(tok))
	if err != nil {
		return httpjson.Errorf(protocol.CodeUnauthenticated, "the bearer token is not an operator token of this control plane")
	}
	hashes, err := s.Store.OperatorTokenHashes(ctx)
	if err != nil {
		return err
	}
	match := false
	for _, k := range hashes {
		// No early exit: the time taken does not say which hash matched.
		if k.Equal(h) {
			match = true
		}
	}
	if !match {
		return httpjson.Errorf(protocol.CodeUnauthenticated, "the bearer token is not an operator token of this control plane")
	}
	return nil
}

func (s *Server) specChanged(site string) {
	if s.Notifier != nil {
		s.Notifier.SpecChanged(site)
	}
}

func decode(r *http.Request, v any) error {
	return httpjson.Decode(r.Body, MaxBodySize, v)
}

// short cuts a value quoted back in an error; human owns how.
