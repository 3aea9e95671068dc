# cdi-device-plugin
GO        ?= go
BIN       ?= bin
IMAGE     ?= cdi-device-plugin:latest
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
CONTAINER ?= docker
LDFLAGS   := -s -w -X main.version=$(VERSION)

export IMAGE

.PHONY: all build run test unit vet bench image deploy undeploy render clean e2e e2e-kind e2e-up e2e-down demo demo-down

all: build

build: ## Build the plugin and the bench tool into $(BIN)/
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/cdi-device-plugin ./cmd/cdi-device-plugin
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/dp-bench ./cmd/dp-bench

run: build ## Build and run the plugin (as root) with the settings in the environment
	$(BIN)/cdi-device-plugin $(RUN_ARGS)

vet: ## go vet and a gofmt check
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi

unit: ## Unit and integration tests with the race detector (needs root for mknod)
	$(GO) test -race -count=1 ./...

test: vet unit ## What CI runs: vet, gofmt, race-enabled tests

bench: build ## Go benchmarks and the plugin binary against the kubelet stand-in
	$(GO) test -run '^$$' -bench . -benchtime 200x ./plugin/ ./prestart/
	$(BIN)/dp-bench -plugin $(BIN)/cdi-device-plugin -runs 20

image: ## Build the container image with the Dockerfile
	$(CONTAINER) build -t $(IMAGE) --build-arg VERSION=$(VERSION) .

render: ## Print the DaemonSet manifests deploy would apply
	deploy/deploy.sh render

deploy: ## Deploy the DaemonSet (NAMESPACE, IMAGE, RESOURCE_NAME, NUMBER_DEVICES, ... from the environment)
	deploy/deploy.sh apply

undeploy: ## Remove the DaemonSet and its namespace
	deploy/deploy.sh delete

e2e: ## End-to-end suite on a local node of real components (root; builds and caches them under ~/.cache)
	e2e/local/run.sh

e2e-kind: ## End-to-end suite on a kind cluster (docker or podman; offline: builds the node image, cached under ~/.cache)
	e2e/kind/run.sh

e2e-up: ## Start the local node only (then: source $$E2E_WORK/env, default /var/lib/cdi-device-plugin-e2e/env)
	e2e/local/cluster.sh up

e2e-down: ## Stop the local node and clean up after it
	e2e/local/cluster.sh down

demo: ## Local node, plugin with 4 devices, a pod using 2: prints what the pod sees
	e2e/local/demo.sh

demo-down: e2e-down ## Tear the demo down

clean:
	rm -rf $(BIN) _artifacts
