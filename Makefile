# Top-level build. `make test` is the project's test command (run by .ci/run).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))

.PHONY: install demo test test-py native runtime profiler bench clean

install:
	$(PIP) install -q -e '.[test]'

# Main job on a built-in example: synthesize AllGather for 2x Azure NDv2 with the paper's sketch.
demo: install
	taccl solve sketches/ndv2-sk-1.json -o out/

# Native parts are built when their directory has a Makefile; the CUDA parts only when nvcc exists.
native: runtime profiler

runtime:
	@if [ -f runtime/Makefile ]; then $(MAKE) -C runtime NVCC="$(NVCC)"; fi

profiler:
	@if [ -f profiler/Makefile ]; then $(MAKE) -C profiler NVCC="$(NVCC)"; fi

test: install native
	$(PYTHON) -m pytest -q tests

bench: install native
	$(PYTHON) benchmarks/synthesis.py
	@for b in benchmarks/quality.py benchmarks/runtime.py benchmarks/batch.py; do \
		if [ -f $$b ]; then $(PYTHON) $$b || exit 1; fi; done

clean:
	rm -rf build dist *.egg-info out .pytest_cache
	@if [ -f runtime/Makefile ]; then $(MAKE) -C runtime clean; fi
	@if [ -f profiler/Makefile ]; then $(MAKE) -C profiler clean; fi
