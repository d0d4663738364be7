"""(helper) A random-weight qwen3moe GGUF with Qwen3-30B-A3B's shapes, for timing qwenc's
mixture-of-experts path against llama.cpp (no real MoE weights are needed for speed), or a
qwen2moe one with Qwen1.5-MoE-A2.7B's (`--arch qwen2moe`: a shared expert and its gate):

    python bench/make_qwen3moe_shape.py OUT.gguf [--layers 8] [--arch qwen2moe]
    python bench/bench_vs_llamacpp.py --model OUT.gguf --random-prompt --activations int16

qwen3moe: hidden 2048, 32 query / 4 kv heads of 128, 128 experts of 768 of which 8 per token.
qwen2moe: hidden 2048, 16 heads of 128 with q/k/v biases, 60 experts of 1408 of which 4, a shared
expert of 5632. Q4_K matrices (Q8_0 where a row is not a multiple of 256), random blocks; float32
routers; the demo model's tokenizer. Fewer layers than the real models' (`--layers`) keep the
file small; a token reads the same bytes per layer as the real model's. The text it writes is
noise: only the timings, and the agreement of the two engines' greedy tokens, mean anything.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

SHAPES = {  # hidden, heads, kv heads, head_dim, experts, per token, expert width, shared expert width
    "qwen3moe": (2048, 32, 4, 128, 128, 8, 768, 0),
    "qwen2moe": (2048, 16, 16, 128, 60, 4, 1408, 5632),
}


def random_blocks(rng, *shape):
    """(data, type) of valid blocks of random content for a [..., rows, cols] matrix: Q4_K (per
    256 values a small f16 scale and min, 12 bytes of 6-bit sub-block scales and mins, 128 bytes
    of nibbles), or Q8_0 (per 32 values a small f16 scale and 32 bytes) where cols does not split
    into 256s."""
    import gguf
    *lead, cols = shape
    k = cols % 256 == 0
    size, width = (256, 144) if k else (32, 34)
    blocks = rng.integers(0, 256, size=(int(np.prod(lead)) * cols // size, width), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.0005 if k else 0.002).tobytes(), np.uint8)
    if k:
        blocks[:, 2:4] = np.frombuffer(np.float16(0.0003).tobytes(), np.uint8)
    T = gguf.GGMLQuantizationType
    return blocks.reshape(*lead, cols // size * width), (T.Q4_K if k else T.Q8_0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the GGUF to write")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (the real models have 48 / 24; default 8)")
    ap.add_argument("--arch", choices=sorted(SHAPES), default="qwen3moe")
    args = ap.parse_args()
    import gguf
    from qwenc.formats.demo import demo_model_path
    HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, MOE_INTER, SHARED = SHAPES[args.arch]
    demo = gguf.GGUFReader(str(demo_model_path()))
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(args.out, args.arch)
    w.add_block_count(args.layers)
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    if SHARED:
        w.add_uint32(f"{args.arch}.expert_shared_feed_forward_length", SHARED)
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
        data, dtype = random_blocks(rng, *shape)
        w.add_tensor(name, data, raw_shape=None, raw_dtype=dtype)

    def vector(name, n, scale=0.0):
        w.add_tensor(name, (1.0 + scale * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, HIDDEN)
    vector("output_norm.weight", HIDDEN)
    matrix("output.weight", vocab, HIDDEN)
    for i in range(args.layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", HIDDEN)
        vector(p + "ffn_norm.weight", HIDDEN)
        if args.arch == "qwen3moe":
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
        if SHARED:
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(HIDDEN).astype(np.float32) * 0.05)
            matrix(p + "ffn_gate_shexp.weight", SHARED, HIDDEN)
            matrix(p + "ffn_up_shexp.weight", SHARED, HIDDEN)
            matrix(p + "ffn_down_shexp.weight", HIDDEN, SHARED)
        if args.arch == "qwen2moe":
            for name, n in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM), ("attn_v", KV_HEADS * HEAD_DIM)):
                w.add_tensor(p + name + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
