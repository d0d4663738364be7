PYTHON ?= python3

.PHONY: build test test-fast bench bench-compare clean

# Compile the C/Cython kernels next to the sources (pip install . does the same into site-packages).
build:
	$(PYTHON) setup.py build_ext --inplace

# The parity suite: kernels vs numpy, the model vs transformers, tokenizer vs HF tokenizers,
# GGUF vs the gguf package, and the real demo model when installed.
test: build
	$(PYTHON) -m pytest -q tests

test-fast: build
	$(PYTHON) -m pytest -q -x tests -k "not real_model"

bench: build
	$(PYTHON) bench/bench_decode.py

# qwenc's modes vs llama.cpp and transformers on the demo model and, when BENCH_MODELS names it,
# the 1.5B GGUF too; writes bench/RESULTS.md and the README's table (needs llama-cpp-python).
BENCH_MODELS ?= demo
bench-compare: build
	$(PYTHON) bench/bench_compare.py --models $(BENCH_MODELS) --readme

clean:
	rm -rf build qwenc/*.so qwenc/_*.c *.egg-info
