PYTHON ?= python3

.PHONY: build test test-fast bench soak clean

# Compile the C/Cython kernels next to the sources (pip install . does the same into site-packages).
build:
	$(PYTHON) setup.py build_ext --inplace

# The parity suite: kernels vs numpy, the model vs transformers, tokenizer vs HF tokenizers,
# GGUF vs the gguf package, and the real demo model when installed.
test: build
	$(PYTHON) -m pytest -q tests

test-fast: build
	$(PYTHON) -m pytest -q -x tests -k "not real_model"

# Five minutes of mixed, partly hostile load on the demo model's server (the suite runs 30 s of it).
soak: build
	$(PYTHON) tests/soak.py --duration 300

bench: build
	$(PYTHON) bench/bench_decode.py

clean:
	rm -rf build qwenc/*.so qwenc/_*.c *.egg-info
