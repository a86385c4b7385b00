# floodgate: build, test and benchmark entry points.
#
#   make test   install what the tests need (redis-server), then go vet and
#               go test -race over every package of every module, and the
#               allocation tests again without the race detector
#   make bench  the side-by-side benchmarks against peer libraries
#   make overload  the overload experiment (about 30 minutes; BENCHMARKS.md)
#   make generate  regenerate the Go code of proto/ (needs protoc and its
#               Go plugins: proto/README.md)
#   make rlsbench  the rate-limit service beside envoyproxy/ratelimit (about
#               6 minutes; docs/benchmarks/rls.md)

GO        ?= go
# Each module is vetted and tested against its own go.mod, as its users
# build it; go.work (there for `go run ./examples/...` from the root) would
# unify their versions.
export GOWORK := off
# The core module (the root) and the modules that carry heavier
# dependencies, so that importing the core never pulls them in.
MODULES   := . redisstore promfloodgate otelfloodgate rls internal/plot examples bench
TESTFLAGS ?= -race -count=1 -timeout 12m
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps vet unit allocs bench overload rlsbench fuzz generate

test: deps vet unit allocs

# Tests start their own redis-server processes on free loopback ports; they
# need the binaries, not a running service.
deps:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
		echo "installing redis-server (needed by the redisstore tests)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	@command -v redis-server >/dev/null 2>&1 || { echo "redis-server is still missing" >&2; exit 1; }

vet:
	@set -e; for m in $(MODULES); do echo "go vet ($$m)"; (cd $$m && $(GO) vet ./...); done

# The examples and bench modules hold load tests that measure a server on
# this machine; they run one package at a time, so that two of them never
# share the CPUs they measure.
SERIAL    := examples bench

unit:
	@set -e; for m in $(MODULES); do echo "go test ($$m)"; \
		p=""; case " $(SERIAL) " in *" $$m "*) p="-p 1";; esac; \
		(cd $$m && $(GO) test $(TESTFLAGS) $$p ./...); done

# The race detector changes allocation counts (sync.Pool drops what it is
# given), so tests that count allocations and skip under it run here, in
# the modules that have them (a test named …Allocs).
ALLOCS    := . redisstore promfloodgate otelfloodgate

allocs:
	@set -e; for m in $(ALLOCS); do (cd $$m && $(GO) test -count=1 -run 'Allocs' ./...); done

# Results and how to read them: bench/README.md.
bench: deps
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -count 5 -timeout 90m . | tee results.txt
	cd bench && $(GO) run ./cmd/memory

# Rewrites BENCHMARKS.md, bench/results/overload.json (the summary the
# report is rendered from), bench/results/raw/ (which git ignores) and the
# charts in docs/benchmarks/.
# As root it pins the server and the load generator to different CPUs and
# gives the server its own cgroup with a CPU quota; otherwise it says so in
# the report and runs without.
overload:
	cd bench && $(GO) run ./cmd/overload

# The generated code is committed; after editing a .proto file, regenerate
# it with protoc and the plugins at the versions of proto/README.md.
generate:
	$(GO) generate ./proto/...

# Rewrites bench/results/rls.json and docs/benchmarks/rls.md. It installs
# envoyproxy/ratelimit with go install into the user's cache directory the
# first time, and pins with taskset where it can.
rlsbench: deps
	cd bench && $(GO) run ./cmd/rls

# A short run of every fuzz target, beyond the seed corpus that make test runs.
fuzz: deps
	$(GO) test -run '^$$' -fuzz FuzzTake -fuzztime 30s ./keyed
	cd redisstore && $(GO) test -run '^$$' -fuzz FuzzLeases -fuzztime 30s .
	cd rls && $(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 30s .
