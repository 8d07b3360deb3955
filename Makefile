# nikki: `make demo` runs a kernel on the simulated NeuronCore, `make test` runs every test.
# Both install missing dependencies first (scripts/setup.sh is idempotent and quick when
# everything is present), then configure and build incrementally in $(BUILD).

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build test test-cpp demo clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test: test-cpp

demo: build
	$(BUILD)/examples/nikki_demo

clean:
	rm -rf $(BUILD)
