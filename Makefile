PYTHON ?= python3

.PHONY: build test test-fast bench clean

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

clean:
	rm -rf build qwenc/*.so qwenc/_*.c *.egg-info
