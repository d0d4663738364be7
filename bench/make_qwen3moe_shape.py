"""(helper) A random-weight qwen3moe GGUF with Qwen3-30B-A3B's shapes, for timing qwenc's
mixture-of-experts path against llama.cpp (no real Qwen3-MoE weights are needed for speed):

    python bench/make_qwen3moe_shape.py OUT.gguf [--layers 8]
    python bench/bench_vs_llamacpp.py --model OUT.gguf --random-prompt --activations int16

hidden 2048, 32 query / 4 kv heads of 128, 128 experts of 768 of which 8 per token, Q4_K
matrices (random blocks), a float32 router, the demo model's tokenizer. Fewer layers than the
real 48 (`--layers`) keep the file small; a token reads the same bytes per layer as the real
model's. The text it writes is noise: only the timings mean anything.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, MOE_INTER = 2048, 32, 4, 128, 128, 8, 768


def q4_k(rng, *shape):
    """Valid Q4_K blocks of random content for a [..., rows, cols] matrix: per 256 values a small
    f16 scale and min, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of nibbles."""
    *lead, cols = shape
    blocks = rng.integers(0, 256, size=(int(np.prod(lead)) * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.0005).tobytes(), np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(0.0003).tobytes(), np.uint8)
    return blocks.reshape(*lead, cols // 256 * 144)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the GGUF to write")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (the real model has 48; default 8)")
    args = ap.parse_args()
    import gguf
    from qwenc.formats.demo import demo_model_path
    T = gguf.GGMLQuantizationType
    demo = gguf.GGUFReader(str(demo_model_path()))
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_block_count(args.layers)
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(MOE_INTER)
    w.add_file_type(15)  # Q4_K_M
    vocab = 0
    for field in demo.fields.values():  # the demo's tokenizer, as llama.cpp and qwenc read it
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            value = field.contents()
            if field.name == "tokenizer.ggml.tokens":
                vocab = len(value)
            w.add_key_value(field.name, value, vtype,
                            sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)

    def matrix(name, *shape):
        w.add_tensor(name, q4_k(rng, *shape), raw_shape=None, raw_dtype=T.Q4_K)

    def vector(name, n, scale=0.0):
        w.add_tensor(name, (1.0 + scale * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, HIDDEN)
    vector("output_norm.weight", HIDDEN)
    matrix("output.weight", vocab, HIDDEN)
    for i in range(args.layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", HIDDEN)
        vector(p + "ffn_norm.weight", HIDDEN)
        vector(p + "attn_q_norm.weight", HEAD_DIM)
        vector(p + "attn_k_norm.weight", HEAD_DIM)
        matrix(p + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        matrix(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(p + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        w.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal((EXPERTS, HIDDEN)).astype(np.float32) * 0.05)
        matrix(p + "ffn_gate_exps.weight", EXPERTS, MOE_INTER, HIDDEN)
        matrix(p + "ffn_up_exps.weight", EXPERTS, MOE_INTER, HIDDEN)
        matrix(p + "ffn_down_exps.weight", EXPERTS, HIDDEN, MOE_INTER)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
