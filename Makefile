# The three entry points: `make build`, `make test`, `make demo`.
# Each installs what it needs (Debian packages) and builds first.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps build test demo clean bazel-test ci-extra

deps:
	@bash tools/install_deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Every C++ target and test again with Bazel 4.2.3 (Debian bazel-bootstrap),
# offline, system libraries (docs/bazel.md); prints `bazel: N passed, N failed`.
bazel-test: deps
	@bash tools/bazel_test.sh

# Reliability checks after `make test` (docs/reliability.md): ASan+UBSan
# unit tests of server/ and scheduler/, and a short libFuzzer run per target.
ci-extra: deps
	@bash tools/ci_extra.sh

demo: build
	$(BUILD_DIR)/bin/rollpack demo

clean:
	rm -rf $(BUILD_DIR)
