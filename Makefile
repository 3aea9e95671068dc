# cdi-device-plugin
GO        ?= go
BIN       ?= bin
IMAGE     ?= cdi-device-plugin:latest
HOST_INSTALLER_IMAGE ?= cdi-device-plugin-host-installer:latest
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
CONTAINER ?= docker
LDFLAGS   := -s -w -X main.version=$(VERSION)
# grpcnotrace leaves out gRPC's x/net/trace (and html/template with it):
# the plugin never serves /debug/requests.
GO_TAGS   := grpcnotrace
# Every pinned version (Kubernetes, containerd, kind, helm, the linter, ...),
# shared with the e2e and bench scripts; override on the command line
# (make e2e K8S_VERSION=v1.37.2; the scripts get it through the
# environment). FEATURE_GATES: the line of K8S_VERSION's minor, as e2e/lib.sh
# takes it.
include e2e/versions.env
FEATURE_GATES ?= $(FEATURE_GATES_$(subst .,_,$(basename $(patsubst v%,%,$(K8S_VERSION)))))
# The linter, built with go install at GOLANGCI_LINT_VERSION into GOBIN
# (outside the clone, so CI's cache keeps it) when missing or at another
# version.
GOBIN     ?= $(shell $(GO) env GOPATH)/bin
GOLANGCI_LINT := $(GOBIN)/golangci-lint
# helm, for the chart's tests and the e2e scenario that installs with it:
# built with go install at HELM_VERSION into a cache outside the clone.
TOOLS_CACHE  ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cdi-device-plugin-tools
HELM         ?= $(TOOLS_CACHE)/helm-$(HELM_VERSION)/helm
export HELM

# make install: the binary, the systemd unit and (when absent) its
# environment file, below DESTDIR. The unit's paths follow BINDIR and
# SYSCONFDIR.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
ENVFILE    := $(SYSCONFDIR)/default/cdi-device-plugin
UNIT_SRC   := deploy/systemd/cdi-device-plugin.service
ENV_SRC    := deploy/systemd/cdi-device-plugin.env

export IMAGE

.PHONY: all help tree-check build install uninstall image-host-installer run test unit vet lint helm lint-chart bench image deploy undeploy render clean bench-dra bench-fleet bench-fleet-prebind e2e e2e-next e2e-versions e2e-kind e2e-up e2e-down demo demo-down

all: build

help: ## List the targets with what they do
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z0-9_-]+:[^#]*## / {printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build the plugin, the DRA driver, its controller and the bench tool into $(BIN)/
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(GO_TAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/cdi-device-plugin ./cmd/cdi-device-plugin
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(GO_TAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/cdi-dra-driver ./cmd/cdi-dra-driver
	CGO_ENABLED=0 $(GO) build -trimpath -tags $(GO_TAGS) -ldflags "$(LDFLAGS)" -o $(BIN)/cdi-dra-controller ./cmd/cdi-dra-controller
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/dp-bench ./cmd/dp-bench

install: ## Install the binary (build it first), the systemd unit and, unless present, its env file (DESTDIR, PREFIX)
	@test -x $(BIN)/cdi-device-plugin || { echo "no $(BIN)/cdi-device-plugin: run make build first"; exit 1; }
	install -D -m 0755 $(BIN)/cdi-device-plugin $(DESTDIR)$(BINDIR)/cdi-device-plugin
	@mkdir -p $(DESTDIR)$(UNITDIR)
	sed -e 's|/usr/local/bin/cdi-device-plugin|$(BINDIR)/cdi-device-plugin|' -e 's|/etc/default/cdi-device-plugin|$(ENVFILE)|' \
	  $(UNIT_SRC) >$(DESTDIR)$(UNITDIR)/.cdi-device-plugin.service.tmp
	chmod 0644 $(DESTDIR)$(UNITDIR)/.cdi-device-plugin.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/.cdi-device-plugin.service.tmp $(DESTDIR)$(UNITDIR)/cdi-device-plugin.service
	@if [ -e $(DESTDIR)$(ENVFILE) ]; then echo "kept $(DESTDIR)$(ENVFILE) (the shipped one is $(ENV_SRC))"; \
	  else echo "install -D -m 0644 $(ENV_SRC) $(DESTDIR)$(ENVFILE)"; install -D -m 0644 $(ENV_SRC) $(DESTDIR)$(ENVFILE); fi
	@if [ -z "$(DESTDIR)" ]; then echo "now: systemctl daemon-reload && systemctl enable --now cdi-device-plugin"; fi

uninstall: ## Remove what install put there; the env file only when it is unchanged (DESTDIR, PREFIX)
	rm -f $(DESTDIR)$(BINDIR)/cdi-device-plugin $(DESTDIR)$(UNITDIR)/cdi-device-plugin.service
	@if [ -e $(DESTDIR)$(ENVFILE) ]; then \
	  if cmp -s $(ENV_SRC) $(DESTDIR)$(ENVFILE); then echo "rm -f $(DESTDIR)$(ENVFILE)"; rm -f $(DESTDIR)$(ENVFILE); \
	  else echo "kept $(DESTDIR)$(ENVFILE): it was edited"; fi; fi

run: build ## Build and run the plugin (as root) with the settings in the environment
	$(BIN)/cdi-device-plugin $(RUN_ARGS)

vet: lint tree-check ## go vet, a gofmt check, golangci-lint (.golangci.yml) and the tree check
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi

# No build output or other blob is tracked: every tracked file is at most
# 1 MiB, and every tracked executable is a script.
tree-check: ## Fail on a tracked file over 1 MiB or a tracked executable that is not a script (#!)
	@git ls-files -s | { bad=0; while read -r mode _ _ f; do \
	  [ -f "$$f" ] || continue; \
	  size=$$(stat -c %s "$$f"); \
	  if [ "$$size" -gt 1048576 ]; then echo "tracked file over 1 MiB: $$f ($$size bytes)" >&2; bad=1; fi; \
	  if [ "$$mode" = 100755 ] && [ "$$(head -c 2 "$$f")" != '#!' ]; then echo "tracked executable that is not a script: $$f" >&2; bad=1; fi; \
	done; exit $$bad; }

lint: ## golangci-lint, installed at GOLANGCI_LINT_VERSION when needed
	@if ! "$(GOLANGCI_LINT)" version 2>/dev/null | grep -q "version $(GOLANGCI_LINT_VERSION:v%=%) "; then \
	  echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOBIN)"; \
	  GOBIN="$(GOBIN)" GOFLAGS=-buildvcs=false $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi
	"$(GOLANGCI_LINT)" run ./...

helm: ## Build the pinned helm (HELM_VERSION) into $(TOOLS_CACHE) when missing
	@if [ ! -x "$(HELM)" ]; then \
	  echo "building helm $(HELM_VERSION) into $(dir $(HELM))"; \
	  GOBIN="$(dir $(HELM))" GOFLAGS=-buildvcs=false CGO_ENABLED=0 $(GO) install -ldflags "-s -w" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

# The chart: helm lint --strict in every mode, for each Kubernetes version
# the project supports (the chart's kubeVersion), with its defaults and with
# the values the e2e suite and the docs install it with
# (deploy/testdata/helm-lint; values.schema.json checks them all).
CHART       := deploy/helm/cdi-device-plugin
CHART_MODES := device-plugin dra per-node
CHART_LINT_VALUES := $(wildcard deploy/testdata/helm-lint/*.yaml)

lint-chart: helm ## helm lint --strict of the chart: every mode, both supported Kubernetes versions, its defaults and deploy/testdata/helm-lint/*.yaml
	@set -e; for v in $(K8S_VERSION) $(K8S_NEXT_VERSION); do for m in $(CHART_MODES); do for f in "" $(CHART_LINT_VALUES); do \
	  if ! out="$$("$(HELM)" lint --strict --quiet $(CHART) --kube-version $$v --set mode=$$m $${f:+-f $$f} 2>&1)"; then \
	    echo "helm lint --strict $(CHART) --kube-version $$v --set mode=$$m $${f:+-f $$f}:"; echo "$$out"; exit 1; fi; \
	done; done; done; \
	echo "helm lint --strict $(CHART): clean in modes $(CHART_MODES), Kubernetes $(K8S_VERSION) and $(K8S_NEXT_VERSION), with its defaults and $(notdir $(CHART_LINT_VALUES))"

unit: helm ## Unit and integration tests with the race detector (needs root for mknod)
	$(GO) test -race -count=1 ./...

test: vet lint-chart unit ## What CI runs first: make vet (golangci-lint, the tree check, go vet, gofmt), make lint-chart (helm lint), then make unit (race-enabled tests)

# make bench: Go benchmarks (cmd/cdi-device-plugin's: UeventToListAndWatch,
# the whole plugin against the kubelet stand-in), then dp-bench runs our plugin and two peers
# (cmd/dp-bench/peers.sh builds them once into $(BENCH_CACHE)) side by side
# and writes docs/benchmarks.md. SQUAT_BIN overrides the generic-device-plugin binary.
BENCH_RUNS  ?= 5
BENCH_IDLE  ?= 10s
BENCH_COUNT ?= 5
BENCH_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cdi-device-plugin-bench

bench: build ## Go benchmarks; dp-bench: our plugin and two peers side by side -> docs/benchmarks.md
	$(GO) test -run '^$$' -bench . -benchtime 300ms -count $(BENCH_COUNT) ./plugin/ ./prestart/ ./cdi/ ./dra/ ./cmd/cdi-device-plugin/ >$(BIN)/gobench.txt || { cat $(BIN)/gobench.txt; exit 1; }
	cat $(BIN)/gobench.txt
	@set -e; peers="$$(BENCH_CACHE=$(BENCH_CACHE) cmd/dp-bench/peers.sh)"; \
	  export PLUGIN_BIN=$(BIN)/cdi-device-plugin; \
	  export SAMPLE_BIN="$$(printf '%s\n' "$$peers" | sed -n 's/^sample-device-plugin=//p')"; \
	  export SQUAT_BIN="$${SQUAT_BIN:-$$(printf '%s\n' "$$peers" | sed -n 's/^generic-device-plugin=//p')}"; \
	  echo "peers: SAMPLE_BIN=$$SAMPLE_BIN SQUAT_BIN=$$SQUAT_BIN"; \
	  $(BIN)/dp-bench -targets cmd/dp-bench/bench.yaml -runs $(BENCH_RUNS) -idle $(BENCH_IDLE) -must-pass cdi-device-plugin -compare cdi-device-plugin \
	    -gobench $(BIN)/gobench.txt -json $(BIN)/benchmarks.json -md docs/benchmarks.md
	@$(MAKE) --no-print-directory bench-dra

# make bench-dra (also the last step of make bench): dp-bench drives our
# DRA driver, with and without its steps, and dra-example-driver's kubelet
# plugin as the kubelet does, against a private etcd and kube-apiserver:
# the e2e node's binaries (e2e/local/build-binaries.sh caches them in
# $(E2E_CACHE)/bin). Without them it says so and is not run;
# docs/benchmarks.md then keeps its DRA tables. DRA_EXAMPLE_BIN overrides
# the peer's binary.
E2E_CACHE            ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cdi-device-plugin-e2e
BENCH_KUBE_APISERVER ?= $(E2E_CACHE)/bin/kube-apiserver-$(K8S_VERSION)
BENCH_ETCD           ?= $(E2E_CACHE)/bin/etcd-$(ETCD_VERSION)
BENCH_DRA_CALLS      ?= 20

bench-dra: build ## dp-bench: our DRA driver beside dra-example-driver, with a private kube-apiserver -> docs/benchmarks.md
	@set -e; for b in $(BENCH_KUBE_APISERVER) $(BENCH_ETCD); do [ -x "$$b" ] || { \
	    echo "dp-bench DRA drivers: not run: no $$b (e2e/local/build-binaries.sh builds it); docs/benchmarks.md keeps its DRA tables"; exit 0; }; done; \
	  peers="$$(BENCH_CACHE=$(BENCH_CACHE) cmd/dp-bench/peers.sh dra-example-kubeletplugin)"; \
	  export DRA_BIN=$(BIN)/cdi-dra-driver; \
	  export DRA_EXAMPLE_BIN="$${DRA_EXAMPLE_BIN:-$$(printf '%s\n' "$$peers" | sed -n 's/^dra-example-kubeletplugin=//p')}"; \
	  echo "peers: DRA_EXAMPLE_BIN=$$DRA_EXAMPLE_BIN"; \
	  $(BIN)/dp-bench -targets cmd/dp-bench/bench-dra.yaml -runs $(BENCH_RUNS) -dra-calls $(BENCH_DRA_CALLS) \
	    -kube-apiserver $(BENCH_KUBE_APISERVER) -etcd $(BENCH_ETCD) -feature-gates $(FEATURE_GATES) \
	    -must-pass cdi-dra-driver -compare cdi-dra-driver -json $(BIN)/benchmarks-dra.json -md docs/benchmarks.md

# make bench-fleet: dp-bench -fleet runs our DRA driver, then
# dra-example-driver's kubelet plugin, each on a fleet of FLEET_NODES nodes
# (a driver and a kubelet stand-in per node) with a private etcd,
# kube-apiserver, kube-scheduler and kube-controller-manager, under nice
# (the machine is shared) -> docs/fleet.md. Not part of CI; about
# 3 x (FLEET_STEADY + FLEET_STORM + FLEET_ROUNDS x 35 s + 1 min) at
# FLEET_NODES=100 (three targets: cmd/dp-bench/fleet.yaml).
FLEET_NODES          ?= 100
FLEET_STEADY         ?= 5m
FLEET_STORM          ?= 30s
FLEET_ROUNDS         ?= 5
# surge: each driver replaced as its DaemonSet rolls it (the new beside the
# old); restart: stopped, then started.
FLEET_ROLLOUT        ?= surge
# cmd/dp-bench/fleet-goals.yaml: the like-for-like pair alone (half the
# processes), for fleets too large for four; FLEET_MD_SECTION: the markers
# of docs/fleet.md its tables go between.
FLEET_TARGETS        ?= cmd/dp-bench/fleet.yaml
FLEET_MD_SECTION     ?= fleet
BENCH_KUBE_SCHEDULER ?= $(E2E_CACHE)/bin/kube-scheduler-$(K8S_VERSION)
BENCH_KUBE_CM        ?= $(E2E_CACHE)/bin/kube-controller-manager-$(K8S_VERSION)

bench-fleet: build ## dp-bench -fleet: our DRA driver and dra-example-driver on FLEET_NODES nodes each -> docs/fleet.md
	@set -e; for b in $(BENCH_KUBE_APISERVER) $(BENCH_ETCD) $(BENCH_KUBE_SCHEDULER) $(BENCH_KUBE_CM); do [ -x "$$b" ] || { 	    echo "dp-bench fleet: not run: no $$b (e2e/local/build-binaries.sh builds it)"; exit 1; }; done; \
	  peers="$$(BENCH_CACHE=$(BENCH_CACHE) cmd/dp-bench/peers.sh dra-example-kubeletplugin)"; \
	  export DRA_BIN=$(BIN)/cdi-dra-driver; \
	  export DRA_EXAMPLE_BIN="$${DRA_EXAMPLE_BIN:-$$(printf '%s\n' "$$peers" | sed -n 's/^dra-example-kubeletplugin=//p')}"; \
	  nice $(BIN)/dp-bench -targets $(FLEET_TARGETS) -fleet $(FLEET_NODES) -fleet-rounds $(FLEET_ROUNDS) -fleet-steady $(FLEET_STEADY) -fleet-storm $(FLEET_STORM) \
	    -fleet-rollout $(FLEET_ROLLOUT) \
	    -kube-apiserver $(BENCH_KUBE_APISERVER) -etcd $(BENCH_ETCD) -kube-scheduler $(BENCH_KUBE_SCHEDULER) \
	    -kube-controller-manager $(BENCH_KUBE_CM) -feature-gates $(FEATURE_GATES) \
	    -fleet-json $(BIN)/fleet.json -fleet-md docs/fleet.md -fleet-md-section $(FLEET_MD_SECTION)

# make bench-fleet-prebind: dp-bench -fleet runs our DRA driver with
# prepareBeforeBind and its controller (cdi-dra-controller), and the same
# driver and step without it (cmd/dp-bench/fleet-prebind.yaml), and
# counts the claim traffic of each -> docs/fleet.md, section
# "fleet-prebind". Counts, not timings: a small fleet tells them.
PREBIND_NODES        ?= 20
PREBIND_ROUNDS       ?= 3
PREBIND_STEADY       ?= 1m
PREBIND_STORM        ?= 0s

bench-fleet-prebind: build ## dp-bench -fleet: our DRA driver with and without prepareBeforeBind, claim traffic -> docs/fleet.md
	@set -e; for b in $(BENCH_KUBE_APISERVER) $(BENCH_ETCD) $(BENCH_KUBE_SCHEDULER) $(BENCH_KUBE_CM); do [ -x "$$b" ] || { \
	    echo "dp-bench fleet: not run: no $$b (e2e/local/build-binaries.sh builds it)"; exit 1; }; done; \
	  export DRA_BIN=$(BIN)/cdi-dra-driver DRA_CONTROLLER_BIN=$(BIN)/cdi-dra-controller; \
	  nice $(BIN)/dp-bench -targets cmd/dp-bench/fleet-prebind.yaml -fleet $(PREBIND_NODES) -fleet-rounds $(PREBIND_ROUNDS) -fleet-steady $(PREBIND_STEADY) -fleet-storm $(PREBIND_STORM) \
	    -kube-apiserver $(BENCH_KUBE_APISERVER) -etcd $(BENCH_ETCD) -kube-scheduler $(BENCH_KUBE_SCHEDULER) \
	    -kube-controller-manager $(BENCH_KUBE_CM) -feature-gates $(FEATURE_GATES) \
	    -fleet-json $(BIN)/fleet-prebind.json -fleet-md docs/fleet.md -fleet-md-section fleet-prebind

image: ## Build the container image with the Dockerfile
	$(CONTAINER) build -t $(IMAGE) --build-arg VERSION=$(VERSION) .

image-host-installer: ## The host installer's image (deploy/host-installer) from the plugin image $(IMAGE)
	$(CONTAINER) build -f deploy/host-installer/Dockerfile --build-arg PLUGIN_IMAGE=$(IMAGE) -t $(HOST_INSTALLER_IMAGE) deploy

render: ## Print the DaemonSet manifests deploy would apply
	deploy/deploy.sh render

deploy: ## Deploy the DaemonSet (NAMESPACE, IMAGE, RESOURCE_NAME, NUMBER_DEVICES, ... from the environment)
	deploy/deploy.sh apply

undeploy: ## Remove the DaemonSet and its namespace
	deploy/deploy.sh delete

e2e: helm ## End-to-end suite on a local node of real components (root; builds and caches them under ~/.cache; K8S_VERSION=, E2E_RUN=)
	e2e/local/run.sh

# make e2e-next: the local node on K8S_NEXT_VERSION (e2e/versions.env) with
# the DRA scenarios and the core device-plugin ones (TestE2E 1-6: each
# builds on the one before, so the pattern keeps the chain from 1); a
# failure's artifacts in _artifacts/local-<version>.
E2E_NEXT_RUN ?= ^TestDRA$$|^TestE2E$$/^(1-daemonset-capacity|2-pod-sees-its-devices|3-prestart-state|4-kubelet-restart|5-plugin-restart|6-device-failure)$$
e2e-next: helm ## make e2e on K8S_NEXT_VERSION (e2e/versions.env): TestDRA and TestE2E 1-6, as CI runs it
	K8S_VERSION=$(K8S_NEXT_VERSION) E2E_RUN='$(E2E_NEXT_RUN)' \
	  E2E_ARTIFACTS="$${E2E_ARTIFACTS:-$(CURDIR)/_artifacts/local-$(K8S_NEXT_VERSION)}" e2e/local/run.sh

e2e-versions: ## Print the component versions and feature gates make e2e uses (K8S_VERSION=...)
	@e2e/local/build-binaries.sh --versions
	@LOG_TAG=e2e-versions bash -c 'source e2e/lib.sh && feature_gates_yaml "" >/dev/null && \
	  [ "$${FEATURE_GATES}" = "$(FEATURE_GATES)" ] || { echo "FEATURE_GATES: e2e/lib.sh says $${FEATURE_GATES}, the Makefile $(FEATURE_GATES)" >&2; exit 1; }; \
	  echo "FEATURE_GATES=$${FEATURE_GATES}"'

e2e-kind: helm ## End-to-end suite on a kind cluster (docker or podman; offline: builds the node image, cached under ~/.cache)
	e2e/kind/run.sh

e2e-up: ## Start the local node only (then: source $E2E_WORK/env, default /var/lib/cdi-device-plugin-e2e/env)
	e2e/local/cluster.sh up

e2e-down: ## Stop the local node and clean up after it
	e2e/local/cluster.sh down

# make demo MODE=dra: the same node, the demo's devices served by the DRA
# driver (docs/dra.md walks through it); MODE=device-plugin is the default.
demo: ## Local node, plugin with 4 devices, a pod using 2: prints what the pod sees; MODE=dra: the DRA driver instead (docs/dra.md)
	MODE="$(MODE)" e2e/local/demo.sh

demo-down: e2e-down ## Tear the demo down: the node, the plugin's specs, device nodes and state, the DRA claim checkpoint, claim specs and device-metadata specs

clean: ## Remove build outputs (bin/, _artifacts/)
	rm -rf $(BIN) _artifacts
