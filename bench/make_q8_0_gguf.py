"""(helper) A Q8_0 GGUF of a GGUF's weights, made by llama.cpp's own quantizer: every tensor
dequantized and requantized to Q8_0 ("pure": the embedding and output head too), for comparing
qwenc and llama.cpp on the same Q8_0 file:

    python bench/make_q8_0_gguf.py OUT.gguf [--model GGUF]      # default: the demo model
    python bench/bench_vs_llamacpp.py --model OUT.gguf --activations int16,int8

qwenc runs the stored Q8_0 blocks with the arithmetic `dtype="q8_0"` gives any model. Needs
llama-cpp-python (a benchmark peer only, not a qwenc dependency).
"""
import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the Q8_0 GGUF to write")
    ap.add_argument("--model", help="source GGUF (default: the demo model)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp
    src = args.model
    if not src:
        from qwenc.formats.demo import demo_model_path
        src = str(demo_model_path())
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    p.allow_requantize = True
    p.pure = True
    p.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(args.out).encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
