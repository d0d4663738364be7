"""Save a random-weight model with the real Qwen2.5-0.5B shapes, in BF16, for benchmarks.

hidden 896, 24 layers, 14 heads / 2 kv heads (head_dim 64), intermediate 4864, vocab 151936,
tied embeddings, q/k/v biases: the same bytes per token as the real model.
"""
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def make(out_dir):
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else "qwen05b-shape-bf16"))
