"""Reference objects built from the demo GGUF: the HF tokenizer as Qwen ships it, and a
tokenizer directory (tokenizer.json + tokenizer_config.json with the chat template) that a
random-weight model directory can carry."""
import json

from qwenc.text.tokenizer import QWEN2_PATTERN, QWEN_NON_SPECIAL

GGUF_KEYS = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
             "tokenizer.ggml.token_type", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
             "tokenizer.chat_template"]


def read_gguf_metadata(path, keys=GGUF_KEYS):
    import gguf
    reader = gguf.GGUFReader(path)
    return {key: reader.fields[key].contents() for key in keys if key in reader.fields}


def qwen2_pipeline(vocab, merges):
    """An HF byte-level BPE tokenizer in Qwen2's pipeline (NFC, the Qwen2 split, ByteLevel) over
    vocab ({token: id}) and merges ([(a, b)]), before any added tokens."""
    import tokenizers
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def build_oracle(md, extra_added=()):
    """HF tokenizer as Qwen ships it, from GGUF metadata; extra_added: (content, id) pairs."""
    from tokenizers import AddedToken

    toks, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    vocab = {t: i for i, (t, k) in enumerate(zip(toks, types)) if k == 1}
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    tok = qwen2_pipeline(vocab, merges)
    added = [(toks[i], i) for i, k in enumerate(types) if k in (3, 4)] + list(extra_added)
    tok.add_tokens([AddedToken(c, special=c not in QWEN_NON_SPECIAL, normalized=False) for c, _ in added])
    for content, tid in added:
        assert tok.token_to_id(content) == tid, "added tokens must land on their GGUF ids"
    return tok


def write_tokenizer_dir(md, oracle, out_dir):
    """Save tokenizer.json and a tokenizer_config.json (eos, pad, Qwen2.5 chat template)."""
    oracle.save(str(out_dir / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>", "special": True}}
    if "tokenizer.chat_template" in md:
        config["chat_template"] = md["tokenizer.chat_template"]
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return out_dir
