# Front door to the CMake build. On a fresh Debian bookworm `make demo` and `make test` each
# install what is missing (`make deps`) and build first; `make`, `make bench`, `make fuzz`.
BUILD ?= build
CMAKE_FLAGS ?=
# Unit tests run in parallel; privileged and e2e tests carry RUN_SERIAL and run alone.
NPROC ?= $(shell nproc)
# `make fuzz`: seconds per libFuzzer target (CI's ctest runs give each SLUICE_FUZZ_SECONDS, 30).
FUZZ_SECONDS ?= 600
# `make soak`: agent kills, and seconds of pod churn while they go on.
SOAK_KILLS ?= 100
SOAK_CHURN_SECONDS ?= 180
# `make soak`: seconds of steady traffic beside long flows, with maps it fills many times over.
SOAK_STEADY_SECONDS ?= 600

DEB_PACKAGES := \
	build-essential cmake ninja-build pkg-config git lld \
	clang llvm libclang-rt-dev libbpf-dev bpftool libelf-dev zlib1g-dev \
	libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev \
	libnl-3-dev libnl-route-3-dev libspdlog-dev libfmt-dev nlohmann-json3-dev \
	libsimdjson-dev libcurl4-openssl-dev libcpp-httplib-dev libyaml-cpp-dev libssl-dev \
	iproute2 iptables nftables ethtool iputils-ping socat netcat-openbsd procps python3 \
	ipset bird2 frr \
	openssl curl util-linux iperf3 python3-prometheus-client \
	podman runc containernetworking-plugins busybox-static \
	buildah crun uidmap mmdebstrap eatmydata \
	golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev \
	golang-github-xeipuuv-gojsonschema-dev nodejs chromium

.PHONY: all build deps image-bases image test test-unit test-privileged bench demo demo-helm fuzz soak clean format

all: build

build: $(BUILD)/build.ninja
	cmake --build $(BUILD)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

# Idempotent and non-interactive: installs only what is missing.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else echo "all build and test packages are installed"; fi
	@# kubectl: the image's own package when present, else Debian's kubernetes-client.
	@command -v kubectl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q kubectl \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -q kubernetes-client
	@# npm: Debian's package, unless the installed nodejs brings its own.
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm
	@# The chart tests' Kubernetes schemas (kubernetes-models), pinned by tests/helm/package-lock.json.
	@test -d tests/helm/node_modules/kubernetes-models || npm ci --prefix tests/helm --no-audit --no-fund

# Complete on a fresh machine, as `make demo` is: the packages first, then the build.
test: deps build
	ctest --test-dir $(BUILD) --output-on-failure --timeout 900 -j$(NPROC)

test-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -LE privileged -j$(NPROC)

test-privileged: build
	ctest --test-dir $(BUILD) --output-on-failure -L privileged --timeout 900

bench: build
	cmake --build $(BUILD) --target benchmarks
	bench/run.sh $(BUILD)

# The fault proofs at length (issue 9): 100 agent kills under load with longer pod churn, and
# 10 rounds of each apiserver fault; then state bounded by live traffic (issue 29): 10 minutes of
# short flows beside long ones, into maps 8x (conntrack) and 4-8x (UDP, masquerade) larger than the
# CI form's, which the traffic still fills many times over. Each prints its figures.
soak: build
	SLUICE_KILLS=$(SOAK_KILLS) SLUICE_CHURN_SECONDS=$(SOAK_CHURN_SECONDS) tests/e2e/agent_kill_test.sh $(BUILD)
	SLUICE_FAULT_ROUNDS=10 tests/e2e/apiserver_faults_test.sh $(BUILD)
	SLUICE_STEADY_SECONDS=$(SOAK_STEADY_SECONDS) SLUICE_STEADY_CT_TCP_MAX=8192 \
		SLUICE_STEADY_CT_ANY_MAX=4096 SLUICE_STEADY_NAT_MAX=4096 \
		SLUICE_STEADY_NAT_PORTS=61000-61255 tests/e2e/steady_state_test.sh $(BUILD)

demo: deps build
	tests/e2e/demo.sh $(BUILD)

# The same demo with Sluice installed from the Helm chart (sluice-lab up --no-agents).
demo-helm: deps build
	tests/e2e/demo.sh $(BUILD) --helm

# The libFuzzer targets (tests/fuzz), FUZZ_SECONDS each, in their own clang build ($(BUILD)/fuzz);
# libFuzzer comes from libclang-rt-dev. Crashes land in $(BUILD)/fuzz/work/<target>/.
fuzz:
	tests/fuzz/fuzz.sh all $(BUILD)/fuzz $(FUZZ_SECONDS)

# The Debian bases of helm/Dockerfile (debian:bookworm, debian:bookworm-slim), built locally
# from Debian's packages with mmdebstrap and checked against helm/image/packages/*.list.
image-bases: deps
	helm/image/base.sh

# The image the chart runs (helm/Dockerfile), built with buildah on those bases from this
# build's binaries (helm/image/build.sh): stored under the chart's image name, written as an
# OCI archive to $(BUILD)/image/sluice-image.oci.tar; prints its id and size.
image: image-bases $(BUILD)/build.ninja
	cmake --build $(BUILD) --target sluice-agent sluice-cni sluicectl sluice-operator
	helm/image/build.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c' | grep -v '^bpf/')

clean:
	rm -rf $(BUILD)
