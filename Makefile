# nodeguard: make help lists every target.

SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

BIN        := $(CURDIR)/bin
GO         ?= go
# Every build here (the tools, the tests, the image) is static and free of
# this machine's paths, as the release image must be: then one compile of each
# package serves them all. Only the race detector needs cgo (make test-race).
export CGO_ENABLED := 0
export GOFLAGS     += -trimpath
# Integration and e2e packages each start a control plane; on 2 cores run at most
# two packages at once.
TEST_P     ?= 2
# The e2e tests mostly wait on the cluster: make test runs them as this many
# processes (each its own control plane) beside the other packages.
E2E_SHARDS ?= 3
TEST_FLAGS ?=
CONTROLLER_GEN := $(BIN)/controller-gen
# The release version stamped into the binary and the image; the tag vX.Y.Z
# on a release.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# The commit stamped into the binary (the Go toolchain's own VCS stamp may be
# off: GOFLAGS=-buildvcs=false).
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDINFO := github.com/nodeguard/nodeguard/internal/buildinfo
LDFLAGS   := -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT)
IMAGE_OUT ?= $(CURDIR)/_output/image
# PUSH=<registry>/<repository>:<tag> makes make image push the index too.
PUSH      ?=
# PLATFORMS=linux/amd64 builds the image for fewer platforms than a release's.
PLATFORMS ?=

export KUBEBUILDER_ASSETS := $(BIN)
export NODEGUARD_BIN_DIR  := $(BIN)

##@ Use

.PHONY: run
run: build tools-sandbox ## Start the local sandbox cluster with nodeguard (make run KUBECONFIG=... runs against an existing cluster).
ifeq ($(origin KUBECONFIG),command line)
	$(BIN)/nodeguard --kubeconfig=$(KUBECONFIG) $(ARGS)
else
	$(GO) build -o $(BIN)/sandbox ./test/sandbox
	$(BIN)/sandbox --bin-dir=$(BIN) $(ARGS)
endif

.PHONY: build
build: ## Build bin/nodeguard and the kubectl plugin bin/kubectl-nodeguard (kubectl nodeguard, once on PATH).
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/nodeguard ./cmd/nodeguard
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kubectl-nodeguard ./cmd/kubectl-nodeguard

##@ Test

.PHONY: test
test: tools-test ## Run unit, integration and e2e tests on Kubernetes 1.37, test-oldest, the chart and release tests, side by side (hack/test.sh; builds the control-plane tools, cert-manager and Karpenter first when missing).
	GO=$(GO) MAKE=$(MAKE) TEST_P=$(TEST_P) E2E_SHARDS=$(E2E_SHARDS) TEST_FLAGS='$(TEST_FLAGS)' hack/test.sh

# The integration tests whose outcome depends on kube-apiserver's behaviour:
# admission of node deletes, and the node conditions a drain writes; and the
# e2e of the core path (a node delete under a NodeDisruptionBudget, drained
# serially per PDB, then released), which also runs kube-controller-manager and
# kube-scheduler 1.36.
OLDEST_WEBHOOK_TESTS := TestKubectlDeleteIsHeldToTheBudget|TestConcurrentDeletesNeverOverAdmit|TestMissingFinalizerNeverLetsANodeGoUnguarded|TestAPIServerDeletesANodeWhoseFinalizerWasAddedDuringItsDelete
OLDEST_FINALIZER_TESTS := TestDrainWritesLifecycleConditions|TestStuckPodNoLongerHoldsTheNode
OLDEST_E2E_TESTS := TestDeleteNodeCutsTrafficThenDrainsWithinBudgets
# The ValidatingAdmissionPolicies of the install, evaluated by kube-apiserver.
OLDEST_INSTALL_TESTS := TestPolicyGuardsTheFieldsNodeguardTrusts

.PHONY: test-oldest
test-oldest: tools-sandbox tools-oldest ## Run the admission and drain integration tests, the core-path e2e and the install's admission policies on Kubernetes 1.36, the oldest supported (bin/k8s-1.36).
	NODEGUARD_KUBE_VERSION=1.36 $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) -run '^($(OLDEST_WEBHOOK_TESTS))$$' ./webhook
	NODEGUARD_KUBE_VERSION=1.36 $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) -run '^($(OLDEST_FINALIZER_TESTS))$$' ./finalizer
	NODEGUARD_KUBE_VERSION=1.36 $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) -run '^($(OLDEST_E2E_TESTS))$$' ./test/e2e
	NODEGUARD_KUBE_VERSION=1.36 $(GO) test -count=1 -timeout 15m $(TEST_FLAGS) -run '^($(OLDEST_INSTALL_TESTS))$$' ./test/install

.PHONY: test-unit
test-unit: ## Run only the tests that need no control plane.
	$(GO) test -short $(TEST_FLAGS) ./...

# The webhook tests mostly wait on their control plane: the other packages
# compile and run meanwhile, on the race-built dependencies compiled first.
# The end-to-end packages are left out: every test in them needs a cluster and
# skips under -short, so a race build of them would run nothing.
RACE_SKIPPED = webhook test/e2e test/install test/certrotation test/sandbox
.PHONY: test-race
test-race: tools-sandbox ## Run under the race detector: the webhook package against its control plane, beside every other package's tests that need no control plane (-short).
	CGO_ENABLED=1 $(GO) test -race -c -o /dev/null ./webhook
	@export CGO_ENABLED=1; \
	$(GO) test -race -timeout 20m $(TEST_FLAGS) ./webhook & webhook=$$!; \
	$(GO) test -race -short $(TEST_FLAGS) $$($(GO) list ./... | grep -vx $(foreach p,$(RACE_SKIPPED),-e github.com/nodeguard/nodeguard/$(p))) || status=$$?; \
	wait $$webhook || status=$$?; \
	exit $${status:-0}

SOAK ?= 20m

.PHONY: soak
soak: tools-sandbox ## Chaos soak for SOAK (default 20m): two replicas, leader SIGKILLed 20+ times, ARM faults, rounds of 6 node deletions; prints its figures (make test runs a short version).
	NODEGUARD_SOAK=$(SOAK) $(GO) test -count=1 -run '^TestChaosSoak$$' -v -timeout 90m $(TEST_FLAGS) ./test/e2e

RESTORE_RUNS ?= 10

.PHONY: test-restore-hold
test-restore-hold: tools-sandbox ## Play the restore hold's stale copies RESTORE_RUNS times (default 10, about 2.5 min each): None again within 15 s of each stale PUT's operation (make test plays them once).
	NODEGUARD_RESTORE_RUNS=$(RESTORE_RUNS) $(GO) test -count=1 -run '^TestRestoredNoneHoldsAgainstStaleCopies$$' -v -timeout 60m $(TEST_FLAGS) ./test/e2e

# FUZZTIME is a count of inputs (Nx) rather than a duration: before Go 1.27 a
# duration's end can fail a target with a bare "context deadline exceeded"
# and no crasher (golang/go#75804). 300000 inputs take about 5 minutes here.
FUZZTIME ?= 300000x

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 300000x, inputs), one after another; a crasher lands in the package's testdata/fuzz.
	@set -e; for file in $$(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./bin/' | sort); do \
		dir=$$(dirname $$file); \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "fuzzing $$target in $$dir for $(FUZZTIME)"; \
			$(GO) test -short -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1x $$dir; \
		done; \
	done

.PHONY: test-chart
test-chart: ## Render the Helm chart and compare it with the kustomize manifests (module test/chart).
	cd test/chart && $(GO) test $(TEST_FLAGS) ./...

.PHONY: test-install
test-install: tools-sandbox tools-certmanager ## Dry-run the kustomize base, run nodeguard under its exact RBAC, test its admission policies, the kustomize uninstall's list and nodeguard uninstall on the local cluster.
	$(GO) test $(TEST_FLAGS) ./test/install

.PHONY: verify
verify: tools-codegen ## Fail when generated files are stale, go.mod is untidy or code is unformatted.
	$(MAKE) generate manifests chart
	$(GO) mod tidy
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	@git diff --exit-code -- api manifests charts go.mod go.sum || { echo "generated files or go.mod are stale: run make generate manifests chart && go mod tidy, then commit"; exit 1; }

.PHONY: lint
lint: ## Run go vet.
	$(GO) vet ./...

##@ Benchmark

BENCH_OUT  ?= $(CURDIR)/_output/bench
BENCH_ARGS ?=

.PHONY: bench
bench: tools-sandbox tools-karpenter ## Benchmark nodeguard against kubectl drain, Karpenter, naive ARM updates and a no-op webhook (about 32 min on 2 cores, about 15 of them the drain section; BENCH_ARGS=--quick for a smoke run, --scale for 2,000 nodes and 40,000 pods).
	@mkdir -p $(BENCH_OUT)
	$(GO) build -o $(BENCH_OUT)/nodeguard ./cmd/nodeguard
	$(GO) build -o $(BENCH_OUT)/bench ./test/bench/cmd/bench
	$(BENCH_OUT)/bench --nodeguard=$(BENCH_OUT)/nodeguard --out=$(BENCH_OUT) $(BENCH_ARGS)

.PHONY: bench-docs
bench-docs: ## Rewrite docs/performance.md's summary table with the rows of the run in BENCH_OUT (its results.json); rows it has no data for are kept.
	$(GO) run ./test/bench/cmd/bench --report-from=$(BENCH_OUT)/results.json --out=$(BENCH_OUT) --docs=docs/performance.md

##@ Generate

.PHONY: generate
generate: tools-codegen ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: tools-codegen ## Generate the CRD, RBAC and webhook manifests from markers.
	$(CONTROLLER_GEN) crd rbac:roleName=nodeguard webhook paths=./... \
		output:crd:dir=manifests/crd output:rbac:dir=manifests/rbac output:webhook:dir=manifests/webhook
	@# controller-gen writes the Role of the markers with
	@# namespace=kube-node-maintenance after the ClusterRole, into the same file:
	@# move it to manifests/maintenance, out of reach of manifests/base's
	@# namespace field, which would move it to nodeguard-system.
	awk '/^---$$/ {n++} {print > (n < 2 ? "manifests/rbac/role.yaml.tmp" : "manifests/maintenance/role.yaml")}' manifests/rbac/role.yaml
	mv manifests/rbac/role.yaml.tmp manifests/rbac/role.yaml

.PHONY: docs
docs: ## Regenerate docs/configuration.md's flag reference from nodeguard --help, and docs/kubectl-nodeguard.md from the plugin's.
	$(GO) test -short -count=1 -run '^TestConfigurationReferenceIsHelp$$' ./cmd/nodeguard -args -update-docs
	$(GO) test -short -count=1 -run '^TestReferenceIsHelp$$' ./cmd/kubectl-nodeguard -args -update-docs

##@ Release

.PHONY: chart
chart: ## Copy the generated CRD, ClusterRole and maintenance Role, the alerts and the dashboard into charts/nodeguard.
	cp manifests/crd/nodeguard.io_nodedisruptionbudgets.yaml charts/nodeguard/crds/
	cp manifests/rbac/role.yaml charts/nodeguard/files/role.yaml
	cp manifests/maintenance/role.yaml charts/nodeguard/files/maintenance-role.yaml
	cp manifests/prometheus/rules.yaml charts/nodeguard/files/prometheus-rules.yaml
	cp manifests/prometheus/dashboard.json charts/nodeguard/files/dashboard.json

.PHONY: image
image: ## Build the linux/amd64 + linux/arm64 image without a container engine: an OCI layout in _output/image (PUSH=<ref> pushes it; docker load reads it as a tar).
	cd hack/release && $(GO) run ./image --root=$(CURDIR) --out=$(IMAGE_OUT) --version=$(VERSION) $(if $(PLATFORMS),--platforms=$(PLATFORMS)) $(if $(PUSH),--push=$(PUSH)) $(if $(IMAGE_DIGEST_FILE),--digest-file=$(IMAGE_DIGEST_FILE))

PLUGIN_OUT       ?= $(CURDIR)/_output/plugin
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64

.PHONY: plugin-archives
plugin-archives: ## Build the kubectl plugin for each of PLUGIN_PLATFORMS into _output/plugin/kubectl-nodeguard_VERSION_OS_ARCH.tar.gz, with their sha256sums (the release attaches them).
	rm -rf $(PLUGIN_OUT) && mkdir -p $(PLUGIN_OUT)
	set -e; for p in $(PLUGIN_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; ext=; [ $$os = windows ] && ext=.exe; \
		dir=$(PLUGIN_OUT)/kubectl-nodeguard_$(VERSION)_$${os}_$${arch}; mkdir -p $$dir; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $$dir/kubectl-nodeguard$$ext ./cmd/kubectl-nodeguard; \
		tar -C $$dir -czf $$dir.tar.gz kubectl-nodeguard$$ext; rm -rf $$dir; \
	done
	cd $(PLUGIN_OUT) && sha256sum *.tar.gz > sha256sums.txt

.PHONY: test-release
test-release: ## Build the image as make image does and check it (config, both platforms, the binary runs, reproducible), and lint the release workflow (module hack/release); make test checks only this machine's platform.
	cd hack/release && $(GO) test -timeout 20m $(TEST_FLAGS) ./...

##@ Tools

.PHONY: tools
tools: ## Build controller-gen, etcd, kube-apiserver, kube-controller-manager, kube-scheduler (1.37, and 1.36 in bin/k8s-1.36), kwok, cert-manager and Karpenter (kwok provider) into bin/ (skips what is built).
	@BIN=$(BIN) hack/tools/build.sh all

# The groups of hack/tools/build.sh, for the targets that need only some.
.PHONY: tools-sandbox tools-codegen tools-oldest tools-certmanager tools-karpenter tools-test
tools-sandbox: ## Build only what make run starts: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.
	@BIN=$(BIN) hack/tools/build.sh sandbox
tools-codegen:
	@BIN=$(BIN) hack/tools/build.sh codegen
tools-oldest: ## Build only kube-apiserver, kube-controller-manager and kube-scheduler 1.36 into bin/k8s-1.36 (make test-oldest).
	@BIN=$(BIN) hack/tools/build.sh oldest
tools-certmanager:
	@BIN=$(BIN) hack/tools/build.sh certmanager
tools-karpenter:
	@BIN=$(BIN) hack/tools/build.sh karpenter
tools-test:
	@BIN=$(BIN) hack/tools/build.sh test

.PHONY: clean
clean: ## Remove bin/ and sandbox state.
	rm -rf $(BIN) .sandbox

.PHONY: help
help: ## List every target.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
