# shardpool — see README.md.
GO      ?= go
BIN     := bin/shardpool
# The test suite runs real processes and an embedded JetStream server; keep
# packages serial so timing-sensitive lease tests are not starved on 2 cores.
TESTFLAGS ?= -race -count=1 -timeout 15m -p 1
# Stamp the commit into the binary (`shardpool version`) where git can read
# this checkout, whatever GOFLAGS says; elsewhere (no git, a checkout git
# refuses as another user's) leave it to GOFLAGS, since -buildvcs=auto
# fails the build there.
BUILDVCS := $(shell git rev-parse --git-dir >/dev/null 2>&1 && echo -buildvcs=auto)

.PHONY: build demo test test-gpu gpu-bundle bench soak soak-powercut soak-cluster vet lint clean tools

# The binary carries the NVML adapter (it loads libnvidia-ml at run time and
# reports GPUs as unknown, never idle, where the library is missing).
build:
	CGO_CFLAGS="-Wno-deprecated-declarations" $(GO) build $(BUILDVCS) -tags nvml -o $(BIN) ./cmd/shardpool

# The main job on the embedded default: generate a corpus, compress and
# checksum it with standard tools, one coordinator and one worker in-process.
demo: build
	./examples/compress/make-corpus.sh 40
	$(BIN) run --data .demo-state examples/compress/shardpool.toml

# Tools the tests need: natscli v0.5.0 for the interop test; staticcheck
# and deadcode for lint, at the versions pinned here.
# Where go install puts them: GOBIN when set, else GOPATH/bin.
GOBIN_DIR := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
STATICCHECK_VERSION := v0.8.2
DEADCODE_VERSION := v0.52.0
tools:
	@command -v nats >/dev/null 2>&1 || [ -x "$(GOBIN_DIR)/nats" ] || \
		$(GO) install github.com/nats-io/natscli/nats@v0.5.0
	@$(GOBIN_DIR)/staticcheck -version 2>/dev/null | grep -qF "($(STATICCHECK_VERSION:v%=%))" || \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@[ -x "$(GOBIN_DIR)/deadcode" ] || $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

# staticcheck with all its checks, style included, on the plain build
# and on the NVML and devprof builds; and no function that nothing,
# tests included, calls (deadcode -test). Functions only tests call are
# allowed: packages export what their tests need.
lint: tools
	$(GOBIN_DIR)/staticcheck -checks all ./...
	CGO_CFLAGS="-Wno-deprecated-declarations" $(GOBIN_DIR)/staticcheck -checks all -tags nvml,devprof ./...
	@out="$$($(GOBIN_DIR)/deadcode -test ./...)"; [ -z "$$out" ] || { echo "$$out"; echo "deadcode -test: the functions above are called by nothing; remove them"; exit 1; }

vet:
	$(GO) vet ./...
	$(GO) vet -tags devprof ./cmd/shardpool
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: tools vet lint
	PATH="$(GOBIN_DIR):$$PATH" $(GO) test $(TESTFLAGS) ./...

# On a machine with NVIDIA GPUs (and PyTorch, for the example job): the real
# NVML adapter against the devices, then examples/gpu/check.sh: preflight,
# a foreign GPU process, profile's peak VRAM, plan, run, SIGKILL and resume.
test-gpu: build
	CGO_CFLAGS="-Wno-deprecated-declarations" $(GO) test -tags nvml -count=1 -v -run RealNVML ./worker/probe
	SHARDPOOL=$(abspath $(BIN)) examples/gpu/check.sh

# The same checks as prebuilt files in dist/gpu, for a GPU machine with no Go.
gpu-bundle: build
	mkdir -p dist/gpu
	CGO_CFLAGS="-Wno-deprecated-declarations" $(GO) test -c -tags nvml -o dist/gpu/probe.test ./worker/probe
	cp $(BIN) dist/gpu/shardpool

# A crash soak: a coordinator and two workers killed at random while 600
# shards run, then every shard checked validated once with a verifying
# output. A tool for hunting rare recovery bugs, not a test (see
# bench/soak; -seed repeats a run's choices).
soak: build
	$(GO) run ./bench/soak -bin $(BIN) -n 600 -events 25 -memory 64MiB

# The same with power cuts among the events (root, loop devices), under
# ext4 and then under XFS (which keeps less of what was not fsynced).
soak-powercut: build
	$(GO) run ./bench/soak -bin $(BIN) -n 600 -events 25 -memory 64MiB -powercut -fs ext4
	$(GO) run ./bench/soak -bin $(BIN) -n 600 -events 25 -memory 64MiB -powercut -fs xfs

# The same against a cluster of three coordinators: each coordinator kill
# picks one of them.
soak-cluster: build
	$(GO) run ./bench/soak -bin $(BIN) -n 800 -events 40 -memory 64MiB -cluster

# Benchmarks print ratios against baselines measured in the same run.
bench: build
	$(GO) run ./bench/pool -bin $(BIN)
	$(GO) run ./bench/probe
	$(GO) run ./bench/stage
	$(GO) run ./bench/commit
	$(GO) run ./bench/admit -bin $(BIN)

clean:
	rm -rf bin .demo-state examples/compress/out examples/compress/corpus examples/compress/manifest.jsonl
