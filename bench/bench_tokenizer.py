"""Tokenizer throughput: qwenc against HuggingFace `tokenizers`, on the same vocabulary.

    python bench/bench_tokenizer.py [--gguf PATH] [--mb 1.0] [--repeats 5]

Text: the parity corpus (tests/data/tokenizer_corpus.jsonl) shuffled and repeated to at least
--mb megabytes of UTF-8, encoded document by document with single `encode` calls (and once as a
single string). HF runs single-threaded here (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
and again in a child process with its default threads. Medians over --repeats runs. Also prints
load times and decode speed. Both tokenizers' ids are checked equal before timing.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.jsonl"

if "--hf-child" not in sys.argv:  # must precede the first import of tokenizers
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, str(ROOT))

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_text(min_mb, seed=0):
    docs = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").split("\n") if line]
    rng = random.Random(seed)
    out, size = [], 0
    while size < min_mb * 1e6:
        batch = docs[:]
        rng.shuffle(batch)
        for d in batch:
            out.append(d)
            size += len(d.encode("utf-8"))
    return out, size


def read_gguf_metadata(path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}


def build_hf(md):
    """HF tokenizer as Qwen ships it (see tests/test_tokenizer.py)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from qwenc.text.tokenizer import QWEN_NON_SPECIAL

    toks, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    vocab = {t: i for i, (t, k) in enumerate(zip(toks, types)) if k == 1}
    merges = [tuple(m.split(" ")) for m in md["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(toks[i], special=toks[i] not in QWEN_NON_SPECIAL, normalized=False)
                    for i, k in enumerate(types) if k in (3, 4)])
    return tok


def hf_child(spec_path, text_path, repeats):
    """Run in a child process with HF's default threading; prints JSON timings."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(spec_path)
    docs = json.loads(Path(text_path).read_text(encoding="utf-8"))
    single = median_time(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], repeats)
    batch = median_time(lambda: hf.encode_batch(docs, add_special_tokens=False), repeats)
    print(json.dumps({"encode": single, "encode_batch": batch}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="GGUF file whose tokenizer to use (default: the demo model)")
    ap.add_argument("--mb", type=float, default=1.0, help="megabytes of text to encode")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hf-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_child:
        return hf_child(*args.hf_child, args.repeats)

    from qwenc.text.tokenizer import Tokenizer

    path = args.gguf
    if path is None:
        from qwenc.formats.demo import demo_model_path
        path = demo_model_path()
    md = read_gguf_metadata(path)
    docs, size = bench_text(args.mb)
    whole = "".join(docs)
    mb = size / 1e6
    print(f"text: {len(docs)} documents, {mb:.2f} MB UTF-8; median of {args.repeats} runs")

    load_md = median_time(lambda: Tokenizer.from_gguf_metadata(md), args.repeats)
    t = time.perf_counter()
    hf = build_hf(md)
    load_hf = time.perf_counter() - t
    q = Tokenizer.from_gguf_metadata(md)
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, text_path = os.path.join(tmp, "tokenizer.json"), os.path.join(tmp, "docs.json")
        hf.save(spec_path)
        Path(text_path).write_text(json.dumps(docs), encoding="utf-8")
        load_json = median_time(lambda: Tokenizer.from_file(spec_path), args.repeats)
        load_hf_json = median_time(lambda: type(hf).from_file(spec_path), args.repeats)
        print(f"load: qwenc from GGUF metadata {load_md * 1e3:.0f} ms, from tokenizer.json {load_json * 1e3:.0f} ms; "
              f"HF from vocab+merges {load_hf * 1e3:.0f} ms, from tokenizer.json {load_hf_json * 1e3:.0f} ms")

        ours = [q.encode(d) for d in docs]
        assert ours == [hf.encode(d, add_special_tokens=False).ids for d in docs], "qwenc and HF disagree"
        n_tokens = sum(map(len, ours))

        t_q = median_time(lambda: [q.encode(d) for d in docs], args.repeats)
        t_hf = median_time(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], args.repeats)
        t_q1 = median_time(lambda: q.encode(whole), args.repeats)
        t_hf1 = median_time(lambda: hf.encode(whole, add_special_tokens=False), args.repeats)
        env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
        child = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--hf-child",
                                spec_path, text_path], env=env, capture_output=True, text=True, check=True)
        hf_default = json.loads(child.stdout.strip().splitlines()[-1])

    print(f"encode, per document ({n_tokens} tokens):")
    print(f"  qwenc                      {mb / t_q:8.2f} MB/s")
    print(f"  HF encode, 1 thread        {mb / t_hf:8.2f} MB/s   qwenc/HF = {t_hf / t_q:.2f}x")
    print(f"  HF encode, default threads {mb / hf_default['encode']:8.2f} MB/s   "
          f"qwenc/HF = {hf_default['encode'] / t_q:.2f}x")
    print(f"  HF encode_batch, default   {mb / hf_default['encode_batch']:8.2f} MB/s   "
          f"qwenc/HF = {hf_default['encode_batch'] / t_q:.2f}x  (all cores: {os.cpu_count()})")
    print("encode, whole text as one string:")
    print(f"  qwenc                      {mb / t_q1:8.2f} MB/s")
    print(f"  HF encode, 1 thread        {mb / t_hf1:8.2f} MB/s   qwenc/HF = {t_hf1 / t_q1:.2f}x")

    flat = [i for ids in ours for i in ids]
    t_dec = median_time(lambda: q.decode(flat), args.repeats)
    t_hf_dec = median_time(lambda: hf.decode(flat, skip_special_tokens=False), args.repeats)
    t_tb = median_time(lambda: [q.token_bytes(i) for i in flat], args.repeats)
    print(f"decode: qwenc {mb / t_dec:.1f} MB/s, HF {mb / t_hf_dec:.1f} MB/s; "
          f"token_bytes {t_tb / len(flat) * 1e9:.0f} ns/token")


if __name__ == "__main__":
    main()
