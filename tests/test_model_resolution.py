"""What `qwenc.load` and the CLI's `-m` accept, and how the demo model gets onto the disk.

One small random model is stored three ways: a HuggingFace directory, a GGUF file holding the
same float32 weights and tokenizer, and a hub repo id in a fake HuggingFace cache (no network).
All three must give bit-identical logits and the same CLI output. Then the failures a user meets
first: a repo id that is not cached, no model at all, and a demo download that is short or
corrupt (refused, with nothing half-written left behind).
"""
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import qwenc
import qwenc.formats.demo
from qwenc import cli
from qwenc.formats.resolve import resolve_model_path
from modelgen import make_model
from oracles import qwen2_pipeline

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

REPO_ID = "TinyOrg/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "t")]


# ---------------------------------------------------------------- one model, three ways

def _tokenizer():
    """A byte-level BPE in Qwen's pipeline (NFC, Qwen2 split, ByteLevel) with a 263-token vocab, so
    it fits the 384-row random model and the text paths (gen, CLI) run on it."""
    from tokenizers import AddedToken, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet + [a + b for a, b in MERGES])}
    tok = qwen2_pipeline(vocab, MERGES)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED])
    return tok, vocab


# HF name -> GGUF name, written out here rather than taken from qwenc.formats.gguf so that a wrong
# mapping there cannot cancel itself out.
_GGUF_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def _gguf_name(hf):
    if hf in _GGUF_TOP:
        return _GGUF_TOP[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_BLOCK[module]}.{kind}"


def write_gguf(model_dir: Path, path: Path, vocab: dict):
    """The directory's float32 weights, config and tokenizer as a qwen2 GGUF (gguf's writer)."""
    from safetensors.numpy import load_file
    cfg = json.loads((model_dir / "config.json").read_text())
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    tokens = sorted(vocab, key=vocab.get) + ADDED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(vocab) + [3] * len(ADDED))  # normal, then control
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_eos_token_id(len(vocab) + ADDED.index("<|im_end|>"))
    for name, arr in load_file(str(model_dir / "model.safetensors")).items():
        assert arr.dtype == np.float32, name
        w.add_tensor(_gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fake_hub_snapshot(hub: Path, repo_id: str, commit: str, src: Path, ref="main"):
    """hub/models--org--name/{refs/<ref>, snapshots/<commit>/...} as huggingface_hub lays it out."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(src, repo / "snapshots" / commit)
    if ref:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes no trailing newline
    return repo / "snapshots" / commit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolution")
    model_dir, _ = make_model(root / "hf", arch="qwen2", dtype="f32", seed=5)
    tok, vocab = _tokenizer()
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    gguf_path = write_gguf(model_dir, root / "tiny.gguf", vocab)
    return model_dir, gguf_path


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny):
    """An HF cache with REPO_ID at COMMIT (refs/main), and HF_HUB_CACHE pointing at it."""
    cache = tmp_path / "hub"
    fake_hub_snapshot(cache, REPO_ID, COMMIT, tiny[0])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    return cache


IDS = [5, 77, 300, 12, 199, 42, 260, 3, 150]


def test_directory_gguf_and_repo_id_load_the_same_model(tiny, hub):
    model_dir, gguf_path = tiny
    by_dir = qwenc.load(model_dir)
    by_file = qwenc.load(gguf_path)
    by_id = qwenc.load(REPO_ID)
    assert Path(by_id.source) == hub / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / COMMIT
    assert Path(by_file.source) == gguf_path
    ref = by_dir.logits(IDS, all_positions=True)
    assert np.abs(ref).max() > 0.1  # a real output, not zeros
    # Same float32 numbers through the same kernels: bit-identical, whichever way they were found.
    np.testing.assert_array_equal(by_file.logits(IDS, all_positions=True), ref)
    np.testing.assert_array_equal(by_id.logits(IDS, all_positions=True), ref)
    for m in (by_dir, by_file, by_id):
        assert m.tokenizer.encode("hello there") == by_dir.tokenizer.encode("hello there")
        assert m.n_vocab == 256 + len(MERGES) + len(ADDED)


def test_path_forms(tiny, monkeypatch):
    model_dir, gguf_path = tiny
    assert resolve_model_path(str(model_dir)) == model_dir
    assert resolve_model_path(gguf_path) == gguf_path  # a Path as well as a str
    monkeypatch.chdir(model_dir.parent)
    assert resolve_model_path(model_dir.name) == Path(model_dir.name)  # relative, no slash
    assert resolve_model_path(f"./{model_dir.name}").resolve() == model_dir.resolve()
    monkeypatch.setenv("HOME", str(model_dir.parent))
    assert resolve_model_path(f"~/{model_dir.name}") == model_dir


def test_refs_main_wins_over_a_newer_snapshot(tiny, hub, tmp_path):
    """Another snapshot (a different model) written later must not be picked while refs/main
    names the first one."""
    other, _ = make_model(tmp_path / "other", arch="qwen2", dtype="f32", seed=99)
    newer = fake_hub_snapshot(hub, REPO_ID, "f" * 40, other, ref=None)
    os.utime(newer.parent / COMMIT, (1e9, 1e9))  # so that "newest snapshot" would be the wrong one
    assert resolve_model_path(REPO_ID) == newer.parent / COMMIT
    a = qwenc.load(REPO_ID).logits(IDS)
    np.testing.assert_array_equal(a, qwenc.load(tiny[0]).logits(IDS))
    assert not np.array_equal(a, qwenc.load(newer).logits(IDS))  # the two snapshots do differ


def test_repo_id_without_refs_uses_its_snapshot(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "hub2"
    snap = fake_hub_snapshot(cache, REPO_ID, COMMIT, tiny[0], ref=None)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert resolve_model_path(REPO_ID) == snap


def test_hf_home_locates_the_cache(tiny, tmp_path, monkeypatch):
    """Without HF_HUB_CACHE the cache is $HF_HOME/hub, as huggingface_hub defines it."""
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    snap = fake_hub_snapshot(tmp_path / "hfhome" / "hub", REPO_ID, COMMIT, tiny[0])
    assert resolve_model_path(REPO_ID) == snap


def test_missing_repo_id_is_a_clear_file_not_found(hub):
    with pytest.raises(FileNotFoundError, match="NoSuchOrg/no-model") as exc:
        qwenc.load("NoSuchOrg/no-model")
    assert str(hub) in str(exc.value)  # says where it looked
    assert "cache" in str(exc.value)


def test_repo_with_dangling_ref_and_no_snapshot(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--Org--broken"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="Org/broken"):
        qwenc.load("Org/broken")


def test_missing_local_paths(tmp_path):
    for spec in (tmp_path / "nothing.gguf", "./no/such/dir", "/no/such/model"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            qwenc.load(spec)


def test_a_file_that_is_not_a_model_is_refused(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("not a model")
    with pytest.raises(ValueError, match="not a model directory or a GGUF file"):
        qwenc.load(junk)


# ---------------------------------------------------------------- the CLI's -m

def run_main(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_model_flag_takes_all_three_forms(tiny, hub, capsys):
    model_dir, gguf_path = tiny
    args = ["--temperature", "0", "-n", "8", "hello"]
    outputs = []
    for spec in (str(model_dir), str(gguf_path), REPO_ID):
        code, out, err = run_main(capsys, "gen", "-m", spec, *args)
        assert code == 0, err
        outputs.append(out)
    expected = qwenc.load(model_dir).generate("hello", max_tokens=8, temperature=0) + "\n"
    assert outputs == [expected] * 3
    assert expected.strip()


def test_cli_model_from_environment(tiny, monkeypatch, capsys):
    monkeypatch.setenv("QWENC_MODEL", str(tiny[1]))
    code, out, err = run_main(capsys, "gen", "--temperature", "0", "-n", "4", "hello")
    assert code == 0, err
    assert out == qwenc.load(tiny[1]).generate("hello", max_tokens=4, temperature=0) + "\n"


def test_cli_missing_repo_id(hub, capsys):
    code, out, err = run_main(capsys, "gen", "-m", "NoSuchOrg/no-model", "hi")
    assert code == 2 and out == ""
    assert "qwenc: error:" in err and "NoSuchOrg/no-model" in err and "cache" in err


def test_cli_without_any_model_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    monkeypatch.setenv("QWENC_CACHE", str(cache))
    monkeypatch.delenv("QWENC_MODEL", raising=False)
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda: None)
    for command in (["gen", "hi"], ["chat"], ["bench"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(command)
        message = str(exc.value.code)  # a string code: Python prints it and exits with status 1
        assert message.startswith("qwenc: no model given"), message
        assert 'pip install "qwenc[demo]"' in message and "-m PATH" in message
        assert "hub repo id" in message
    assert list(cache.iterdir()) == []  # nothing assembled, nothing half-written


# ---------------------------------------------------------------- demo assembly

@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three small part files; DEMO_SIZE and DEMO_SHA256 describe their concatenation."""
    rng = np.random.default_rng(0)
    blobs = [b"GGUF" + rng.bytes(1000), rng.bytes(1), rng.bytes(70_000)]
    parts = []
    for i, blob in enumerate(blobs, start=1):
        p = tmp_path / "parts" / f"part{i:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(blob)
        parts.append(p)
    whole = b"".join(blobs)
    monkeypatch.setattr(qwenc.formats.demo, "DEMO_SIZE", len(whole))
    monkeypatch.setattr(qwenc.formats.demo, "DEMO_SHA256", hashlib.sha256(whole).hexdigest())
    return parts, whole


def test_assemble_concatenates_in_order(fake_parts, tmp_path):
    parts, whole = fake_parts
    target = tmp_path / "cache" / "model.gguf"
    progress = io.StringIO()
    assert qwenc.formats.demo.assemble(parts, target, progress=progress) == target
    assert target.read_bytes() == whole
    assert list(target.parent.iterdir()) == [target]
    assert progress.getvalue().endswith("\n") and "assembling demo model" in progress.getvalue()


def test_assemble_refuses_wrong_size(fake_parts, tmp_path, monkeypatch):
    parts, whole = fake_parts
    monkeypatch.setattr(qwenc.formats.demo, "DEMO_SIZE", len(whole) + 1)
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match=f"{len(whole)} bytes, expected {len(whole) + 1}"):
        qwenc.formats.demo.assemble(parts, target, progress=None)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_assemble_refuses_wrong_hash_and_leaves_nothing(fake_parts, tmp_path, monkeypatch):
    parts, whole = fake_parts
    monkeypatch.setattr(qwenc.formats.demo, "DEMO_SHA256", hashlib.sha256(whole[:-1] + b"x").hexdigest())
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match="SHA-256"):
        qwenc.formats.demo.assemble(parts, target, progress=None)
    assert list(target.parent.iterdir()) == []  # the partial file is gone


def test_failed_assembly_keeps_an_existing_file(fake_parts, tmp_path, monkeypatch):
    parts, whole = fake_parts
    target = tmp_path / "cache" / "model.gguf"
    target.parent.mkdir()
    target.write_bytes(b"previous")
    monkeypatch.setattr(qwenc.formats.demo, "DEMO_SHA256", "0" * 64)
    with pytest.raises(qwenc.formats.demo.DemoModelMissing):
        qwenc.formats.demo.assemble(parts, target, progress=None)
    assert target.read_bytes() == b"previous"
    assert list(target.parent.iterdir()) == [target]


def test_a_corrupted_part_is_caught_by_the_hash(fake_parts, tmp_path):
    """Same size, one flipped byte: only the hash can tell."""
    parts, whole = fake_parts
    data = bytearray(parts[2].read_bytes())
    data[12345] ^= 0xFF
    parts[2].write_bytes(bytes(data))
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match="SHA-256"):
        qwenc.formats.demo.assemble(parts, target, progress=None)
    assert not target.exists()


def test_demo_model_path_assembles_once(fake_parts, tmp_path, monkeypatch):
    parts, whole = fake_parts
    monkeypatch.setenv("QWENC_CACHE", str(tmp_path / "qc"))
    calls = []
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda: calls.append(1) or parts)
    path = qwenc.formats.demo.demo_model_path(progress=None)
    assert path == tmp_path / "qc" / qwenc.formats.demo.DEMO_FILENAME and path.read_bytes() == whole
    assert qwenc.formats.demo.demo_model_path(progress=None) == path
    assert len(calls) == 1  # the second call found the assembled file and did not touch the parts


def test_demo_model_path_without_parts(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENC_CACHE", str(tmp_path / "qc"))
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install"):
        qwenc.formats.demo.demo_model_path(progress=None)
