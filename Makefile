# nikki: `make demo` runs a kernel on the simulated NeuronCore, `make test` runs every test.
# Both install missing dependencies first (scripts/setup.sh is idempotent and quick when
# everything is present), then configure and build incrementally in $(BUILD).

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

PYTHON ?= python3

.PHONY: all setup configure build develop test test-cpp test-python typecheck fuzz sweep bench demo clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Explicit opt-in: makes `import nikki` resolve to this tree for the current user (a .pth file in
# the user's site-packages). Building, testing and the demo never touch anything outside the tree.
develop: build
	@scripts/develop.sh

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# tests/fuzz runs a bounded fuzz campaign (a few hundred generated kernels per front end); it is
# listed first so that its long tests start early on one worker while the other takes the rest.
# PYTEST_WORKERS processes (pytest-xdist) share the work; each peaks near 1.5 GB resident.
PYTEST_WORKERS ?= 2
test-python: build
	BUILD=$(BUILD) PYTHONPATH=$(CURDIR)/bindings/python $(PYTHON) -m pytest tests/fuzz tests/python -q \
		-n $(PYTEST_WORKERS) --dist worksteal

# The fuzzer at full size: 10^5 generated kernels per front end, from seed NIKKI_FUZZ_SEED (default
# 0); reproducers of failures land in $(BUILD)/fuzz-failures.
fuzz: build
	BUILD=$(BUILD) NIKKI_FUZZ_CASES=100000 PYTHONPATH=$(CURDIR)/bindings/python \
		$(PYTHON) -m pytest tests/fuzz -q -s

# The Python package type-checks with mypy (settings in pyproject.toml, [tool.mypy]).
typecheck: setup
	$(PYTHON) -m mypy

test: test-cpp test-python typecheck

# Many more randomly drawn cases of every library kernel than `make test` runs, against the
# float64 references (C++ and Python) and PyTorch (Python). SWEEP_CASES per kernel.
SWEEP_CASES ?= 60
sweep: build
	cd $(BUILD) && NIKKI_SWEEP_CASES=$(SWEEP_CASES) ./tests/cpp/nikki_tests -tc="library kernels: randomly drawn*"
	NIKKI_SWEEP_CASES=$(SWEEP_CASES) PYTHONPATH=$(CURDIR)/bindings/python $(PYTHON) -m pytest -q \
		tests/python/kernels/test_kernel_properties.py

# Every library kernel over a size sweep: estimates on trn2/trn1 and host simulation time against
# PyTorch CPU and numpy-eager, plus the matmul tutorial's published latencies; rewrites
# docs/benchmarks.md and its plots. The Google Benchmark
# entries of the same kernels are $(BUILD)/bench/nikki_bench_kernels.
# NKI_LIBRARY=path/to/nki-library also estimates that checkout's kernels beside nikki's.
NKI_LIBRARY ?=
bench: build
	PYTHONPATH=$(CURDIR)/bindings/python $(PYTHON) bench/python/kernel_bench.py \
		--markdown docs/benchmarks.md --plots docs/benchmarks --json $(BUILD)/benchmarks.json \
		$(if $(NKI_LIBRARY),--nki-library $(NKI_LIBRARY))

# The C++ kernels on the reference interpreter, then flash attention from PyTorch with its profile.
demo: build
	$(BUILD)/examples/nikki_demo
	PYTHONPATH=$(CURDIR)/bindings/python $(PYTHON) examples/flash_attention_demo.py \
		--trace $(BUILD)/flash_attention_trace.json

clean:
	rm -rf $(BUILD)
