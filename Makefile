# bcd: `make demo` runs the most complete flow there is; `make test` runs every test.
# Both install what they need first (scripts/install-deps.sh, idempotent).

GO       ?= go
VERSION  ?= 0.1.0-dev
PKG      := github.com/better-compute/bcd
LDFLAGS  := -s -w -X $(PKG)/internal/version.Version=$(VERSION)
BIN      := bin
# Every Go build here is static: the same bcd runs on a host, in a ramdisk and in a test root.
export CGO_ENABLED := 0

.PHONY: all build deps test lint demo demo-loopback release initramfs bench-boot bench-deploy bench-fleet bench-sessions e2e-debian clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/bcd ./cmd/bcd
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/better-compute ./cmd/better-compute
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/bcx-ipmi ./plugins/bcx-ipmi

deps:
	scripts/install-deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@# go.mod and go.sum as go mod tidy leaves them: a direct import marked indirect
	@# (or a dependency nothing imports) fails here, not in a later review.
	@$(GO) mod tidy -diff >/dev/null || { echo "go mod tidy would change go.mod/go.sum (run go mod tidy; go mod tidy -diff shows what):"; $(GO) mod tidy -diff; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags fakehw ./...
	$(GO) vet -tags e2edebian ./testbed

# BCD_REQUIRE_ALL=1: a test that would skip for a missing tool, root or VM fails instead.
test: deps lint
	BCD_REQUIRE_ALL=1 $(GO) test -count=1 -timeout 30m ./...
	BCD_REQUIRE_ALL=1 $(GO) test -count=1 -timeout 10m -tags fakehw ./agent/... ./cmd/bcd/... ./nodeagent/...

# Issue 8's Debian flavour in the QEMU lab (testbed/debian_test.go, build tag
# e2edebian, so make test leaves it out): a PXE machine deployed with Debian and
# systemd, bcd under the hardened unit, and a machine set up by the install script;
# TestDebianTPM: three machines running the --attestor tpm script (swtpm): an
# enrolled EK joins with the node key in the TPM and survives an upgrade run, an
# unenrolled one of a registered machine waits for machines approve, one without a
# TPM stops before installing anything; TestDebianSelfUpdate: two script-installed
# machines update themselves from releases scripts/release.sh signed (a rollout in
# waves, a build that never reaches its Welcome, one that crash-loops, four refused
# manifests, an install-script rerun); TestDebianHelper: a machine installed by the
# --unprivileged --attestor tpm script over an old script's state (bcd in tss, the
# udev rule), bcd node as bcd without capabilities beside a root bcd helper that
# reboots it, updates it by a rollout and refuses a copy of bcd run from elsewhere.
# About 10 minutes on 2 cores under TCG, plus 11–13 for TestDebianSelfUpdate and
# about 7 for TestDebianHelper (README.md has the times).
# The Debian roots are cached in .cache/debian and .cache/debian-stock (rebuilt when their scripts change).
e2e-debian: deps
	scripts/build-debian-image.sh >/dev/null
	scripts/build-debian-stock-image.sh >/dev/null
	BCD_REQUIRE_ALL=1 $(GO) test -tags e2edebian -count=1 -timeout 100m -run TestDebian -v ./testbed

# The whole fleet path in the QEMU lab (testbed/cmd/bcd-lab); KEEP=1 leaves it up.
demo: deps build initramfs
	$(GO) run ./testbed/cmd/bcd-lab -bin $(BIN) -ramdisk $(BIN)/initramfs.xz -image $(BIN)/testos.img

# The loopback-only flow of the control plane and one node (no VMs).
demo-loopback: deps build
	scripts/demo.sh

# dist/: bare binaries, archives, .sha256 files and checksums.txt for linux/amd64 and arm64.
release:
	VERSION=$(VERSION) scripts/release.sh

# The PXE ramdisk: u-root + bcd + tools + Debian kernel modules, next to Debian's kernel.
initramfs: deps
	initramfs/build.sh $(BIN)/initramfs.xz .cache/kernel/current
	cp .cache/kernel/current/vmlinuz $(BIN)/vmlinuz

# Side-by-side benchmarks (bench/README.md); results go to bench/results/.
# bench-boot: the shipped bcd site (joined to a real serve, 1,000 machines) and
# the boot library against dnsmasq, tftp-hpa and nginx, ~13 minutes; it holds the
# machine's heavy-run lock so that no other measurement overlaps it.
bench-boot:
	BCD_DEPS="nginx-light" scripts/install-deps.sh
	flock /tmp/bcd-heavy.lock bench/run.sh

bench-deploy: deps
	$(GO) run ./bench/deploy

# The boot storm (sim/simlab/fleetbench): 1,000 machines played by bcd sim through
# one bcd site and one better-compute serve, then again with serve and the site agent
# restarted during the run; the report goes to bench/results/fleet-<date>.txt. Built
# first; then it waits for the machine to be free of VMs (any qemu-system) and runs
# holding /tmp/bcd-heavy.lock (shared with the other heavy runs), queueing again if
# a VM started meanwhile. MACHINES=N changes the size.
MACHINES ?= 1000
bench-fleet: deps build
	$(GO) build -o $(BIN)/fleetbench ./sim/simlab/fleetbench
	out=bench/results/fleet-$$(date -u +%Y-%m-%d).txt; \
	while :; do \
		while pgrep qemu-system >/dev/null; do sleep 10; done; \
		flock /tmp/bcd-heavy.lock sh -c 'if pgrep qemu-system >/dev/null; then exit 75; fi; \
			exec $(BIN)/fleetbench -bin $(BIN) -machines $(MACHINES) -out '"$$out"; \
		rc=$$?; [ $$rc -ne 75 ] && exit $$rc; \
	done

# Issue 16's 10,000 node sessions (sim/simlab/sessionbench): SESSIONS nodes joined
# through the shipped better-compute serve (a token each over the operator api, then
# bcd join's code), serve restarted, then every node's agent.Session (bcd node's
# client) held on it; serve's RSS before and after, per session and at its peak, the
# connect times, its CPU over a 60 s window of heartbeats only, and whether any
# session dropped. All in a network namespace of its own; about 4 minutes at 10,000.
# Built first, then run as bench-fleet is: no VM running, holding /tmp/bcd-heavy.lock;
# the report goes to bench/results/sessions-<date>.txt.
SESSIONS ?= 10000
bench-sessions: deps build
	$(GO) build -o $(BIN)/sessionbench ./sim/simlab/sessionbench
	out=bench/results/sessions-$$(date -u +%Y-%m-%d).txt; \
	while :; do \
		while pgrep qemu-system >/dev/null; do sleep 10; done; \
		flock /tmp/bcd-heavy.lock sh -c 'if pgrep qemu-system >/dev/null; then exit 75; fi; \
			exec $(BIN)/sessionbench -bin $(BIN) -sessions $(SESSIONS) -out '"$$out"; \
		rc=$$?; [ $$rc -ne 75 ] && exit $$rc; \
	done

clean:
	rm -rf $(BIN)
