"""Coverage-guided fuzzing of qwenc's model-file readers with atheris (libFuzzer), for `make fuzz`.

    python tests/fuzz_atheris.py [--kind all|gguf|hf|demo_header] [--workdir DIR] -- [libFuzzer options]

The cases are those of tests/fuzzing.py, their choices read from libFuzzer's input, so coverage
of qwenc's Python code steers the mutations. A broken contract does not stop the run: each
distinct finding (exception type and the line it came from) is written once to
DIR/findings.txt with the input that caused it (DIR/finding-N.bin, replayable with
--replay FILE). DIR/stats.json holds the counts, refreshed as the run goes.
"""
import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[0:0] = [ROOT, HERE]  # this checkout's qwenc, and the tests' helpers

import atheris  # noqa: E402

with atheris.instrument_imports(include=["qwenc"]):
    import qwenc  # noqa: F401
    import fuzzing  # noqa: E402

# The demo header case costs ~0.5 s (a 6 MB header); the others a few ms each.
WEIGHTS = ["gguf"] * 20 + ["hf"] * 19 + ["demo_header"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="all", choices=("all",) + fuzzing.KINDS)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "fuzz"))
    ap.add_argument("--replay", help="run one saved input and show what it does")
    args, libfuzzer_args = ap.parse_known_args()
    libfuzzer_args = [a for a in libfuzzer_args if a != "--"]

    from qwenc.formats.demo import demo_model_path
    ws = fuzzing.Workspace(os.path.join(args.workdir, "work"), demo_model_path(progress=None))
    stats = {"executions": 0, "loaded": 0, "refused": 0, "finding": 0, "by_kind": {}, "started": time.time()}
    seen = {}
    findings_txt = os.path.join(args.workdir, "findings.txt")
    stats_json = os.path.join(args.workdir, "stats.json")

    def kind_of(fdp):
        return WEIGHTS[fdp.ConsumeIntInRange(0, len(WEIGHTS) - 1)] if args.kind == "all" else args.kind

    def one_input(data):
        fdp = atheris.FuzzedDataProvider(data)
        kind = kind_of(fdp)
        try:
            outcome = fuzzing.run_case(ws, kind, fuzzing.AtherisSource(fdp))
        except Exception as exc:  # a finding: record it once, keep going
            outcome = "finding"
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            key = f"{type(exc).__name__} at {os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
            if key not in seen:
                seen[key] = len(seen)
                with open(os.path.join(args.workdir, f"finding-{seen[key]}.bin"), "wb") as f:
                    f.write(data)
                with open(findings_txt, "a") as f:
                    f.write(f"[{seen[key]}] {kind}: {key}: {str(exc)[:500]}\n"
                            + "".join(traceback.format_exception(exc)[-6:]) + "\n")
        stats["executions"] += 1
        stats[outcome] += 1
        k = stats["by_kind"].setdefault(kind, {"loaded": 0, "refused": 0, "finding": 0})
        k[outcome] += 1
        if stats["executions"] % 50 == 0:  # libFuzzer ends the process without Python's atexit
            write_stats()

    def write_stats():
        stats["seconds"] = round(time.time() - stats["started"], 1)
        stats["distinct_findings"] = len(seen)
        with open(stats_json, "w") as f:
            json.dump(stats, f, indent=1)

    if args.replay:
        with open(args.replay, "rb") as f:
            data = f.read()
        fdp = atheris.FuzzedDataProvider(data)
        print(fuzzing.run_case(ws, kind_of(fdp), fuzzing.AtherisSource(fdp)))
        return
    os.makedirs(args.workdir, exist_ok=True)
    open(findings_txt, "w").close()
    # A corpus of random inputs to start from: libFuzzer's own start (one empty input, lengths
    # growing slowly) would spend minutes on cases whose every choice is the first.
    corpus = os.path.join(args.workdir, "corpus")
    if not os.path.isdir(corpus):
        os.makedirs(corpus)
        import random
        rng = random.Random(0)
        for i in range(64):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(bytes(rng.randrange(256) for _ in range(rng.randrange(16, 1024))))
    atheris.Setup([sys.argv[0], "-max_len=4096", "-len_control=0"] + libfuzzer_args + [corpus], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
