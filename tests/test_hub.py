"""Hub ids end to end, through huggingface_hub's real client code, against a local stand-in for the
hub (tests/hubserver.py, 127.0.0.1 only) reached through HF_ENDPOINT.

The repos hold small random models (tests/tinymodel.py): a sharded safetensors repo with two
commits (tag v1 and main) and the duplicates a real repo carries (pytorch_model.bin, ONNX, flax,
README), a GGUF repo with several quantizations and a model split in three files, a private
repo, and repos qwenc must refuse. Every model loaded from the hub must give exactly the logits
of the same files loaded from a local directory; the server's request log shows what was fetched
(and what never was), that a cached model is not fetched again, that offline means no request,
and that an interrupted transfer resumes where it broke.
"""
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import qwenc
from qwenc.errors import ModelFormatError, ModelNotFound
from qwenc.formats import catalog
from qwenc.formats.hub import HubRef, parse_hub_ref, quant_label

from hubserver import HubServer
from tinymodel import make_tiny, write_gguf

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import constants as hf_constants  # noqa: E402
gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parent.parent
ST, GG = "TinyOrg/tiny-qwen2", "TinyOrg/tiny-qwen2-GGUF"
PRIVATE, TOKEN = "TinyOrg/private-GGUF", "hf_test_0123456789"
IDS = [5, 77, 300, 12, 199, 42, 260, 3, 150]
DECOYS = {"pytorch_model.bin": b"\x80\x02pickle" * 500, "original/consolidated.pth": b"pth" * 300,
          "onnx/model.onnx": b"onnx" * 300, "onnx/model.safetensors": b"not-this-one" * 50,
          "flax_model.msgpack": b"msgpack" * 300, "README.md": b"# tiny qwen2\n", ".gitattributes": b"*.bin lfs\n",
          "vocab.json": b"{}", "merges.txt": b"#version: 0.2\n"}


def _files(folder: Path):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-models")
    m = SimpleNamespace()
    # Two commits of the safetensors repo: different weights, so a wrong revision shows.
    m.st_v1 = make_tiny(root / "st-v1", seed=5, shard_size="300KB")
    m.st_main = make_tiny(root / "st-main", seed=6, shard_size="300KB")
    assert (m.st_main / "model.safetensors.index.json").is_file()
    m.shards = sorted(p.name for p in m.st_main.glob("*.safetensors"))
    assert len(m.shards) >= 2
    # The GGUF repo's model: dimensions that Q4_K blocks (256 values) divide.
    g = make_tiny(root / "g", seed=7, hidden_size=256, intermediate_size=512)
    m.gguf = {q: write_gguf(g, root / "gguf" / f"tiny-{q}.gguf", q) for q in ("F16", "Q8_0", "Q4_K_M")}
    m.f32 = write_gguf(g, root / "f32" / "tiny-F32.gguf", "F32")
    m.split = write_gguf(g, root / "split" / "tiny-F32.gguf", "F32", split_max_tensors=10)
    m.split_names = sorted(p.name for p in (root / "split").iterdir())
    assert len(m.split_names) == 3
    return m


@pytest.fixture(scope="module")
def hub(models):
    server = HubServer().start()
    st = server.add_repo(ST)
    server.v1 = server.publish(st, {**_files(models.st_v1), **DECOYS}, refs=("v1",))
    server.main = server.publish(st, {**_files(models.st_main), **DECOYS}, refs=("main",))
    gg = server.add_repo(GG)
    files = {p.name: p.read_bytes() for p in models.gguf.values()}
    files.update({n: (models.split.parent / n).read_bytes() for n in models.split_names})
    files["mmproj-tiny-F16.gguf"] = b"GGUF not a language model"
    files["README.md"] = b"# GGUF quantizations\n"
    server.publish(gg, files)
    server.publish(server.add_repo("TinyOrg/no-default-GGUF"),
                   {p.name: p.read_bytes() for q, p in models.gguf.items() if q != "Q4_K_M"})
    server.publish(server.add_repo(PRIVATE, token=TOKEN), {"tiny-Q8_0.gguf": models.gguf["Q8_0"].read_bytes()})
    server.publish(server.add_repo("TinyOrg/pytorch-only"),
                   {"config.json": (models.st_main / "config.json").read_bytes(), **DECOYS})
    yield server
    server.stop()


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """A fresh HF_HOME, HF_ENDPOINT at the local hub, no token, not offline; the log cleared."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: if the outer environment had it set,
    # its HTTP session would refuse every request these tests mean to make.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    hub.clear_log()
    return SimpleNamespace(cache=tmp_path / "hf" / "hub", tmp=tmp_path)


def _snapshot(cache, repo_id, commit):
    return cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit


def _same_logits(a, b):
    la, lb = a.logits(IDS, all_positions=True), b.logits(IDS, all_positions=True)
    assert np.abs(lb).max() > 0.1
    np.testing.assert_array_equal(la, lb)


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("spec,ref", [
    ("Qwen/Qwen2.5-0.5B-Instruct", HubRef("Qwen/Qwen2.5-0.5B-Instruct")),
    ("Org/Repo-GGUF:Q4_K_M", HubRef("Org/Repo-GGUF", quant="Q4_K_M")),
    ("Org/repo@v1.0", HubRef("Org/repo", revision="v1.0")),
    ("Org/repo:q8_0@" + "a" * 40, HubRef("Org/repo", quant="q8_0", revision="a" * 40)),
    ("Org/repo@dev:Q8_0", HubRef("Org/repo", quant="Q8_0", revision="dev")),
    ("Org/repo@refs/pr/3", HubRef("Org/repo", revision="refs/pr/3")),
    ("Org/repo/sub/x-Q4_K_M.gguf@main", HubRef("Org/repo", filename="sub/x-Q4_K_M.gguf", revision="main")),
])
def test_hub_ids_parse(spec, ref):
    assert parse_hub_ref(spec) == ref
    assert parse_hub_ref(str(ref)) == ref


@pytest.mark.parametrize("spec", ["Org/repo/config.json", "Org/repo:a:b", "Org/repo@a@b", "Org", "Org/",
                                  "-Org/repo", "Org/re po", "Org/repo:"])
def test_what_is_not_a_hub_id(spec):
    assert parse_hub_ref(spec) is None


def test_a_file_and_a_quantization_together_are_refused():
    with pytest.raises(ModelNotFound, match="not both"):
        parse_hub_ref("Org/repo/x.gguf:Q8_0")


@pytest.mark.parametrize("name,label", [
    ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "Q4_K_M"), ("Qwen3-8B-UD-Q4_K_XL.gguf", "Q4_K_XL"),
    ("tinyllama-1.1b-chat-v1.0.Q5_K_S.gguf", "Q5_K_S"), ("ggml-model-f16.gguf", "F16"),
    ("Llama-3-8B-IQ4_XS.gguf", "IQ4_XS"), ("model-bf16-00002-of-00004.gguf", "BF16"),
    ("Q8_0/Big-Model-00001-of-00002.gguf", "Q8_0"), ("model.gguf", None), ("qwen2.5-1.5b.gguf", None),
])
def test_quantization_labels_from_file_names(name, label):
    assert quant_label(name) == label


# ---------------------------------------------------------------- safetensors repositories

def test_safetensors_repo_gets_only_what_a_model_directory_needs(online, hub, models):
    model = qwenc.load(ST)
    snap = _snapshot(online.cache, ST, hub.main)
    assert Path(model.source) == snap
    needed = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors.index.json", *models.shards}
    assert hub.files_requested() == needed
    assert set(_files(snap)) == needed
    for r in hub.log:  # not even asked about
        assert not any(d in r.path for d in DECOYS), r.path
    _same_logits(model, qwenc.load(models.st_main))
    assert model.tokenizer.encode("hello there") == qwenc.load(models.st_main).tokenizer.encode("hello there")


def test_a_second_load_downloads_nothing(online, hub, models):
    qwenc.load(ST)
    hub.clear_log()
    model = qwenc.load(ST)
    # One question (where main points now), no file requests.
    assert [r.path for r in hub.log] == [f"/api/models/{ST}"]
    _same_logits(model, qwenc.load(models.st_main))


def test_revisions_are_pinned(online, hub, models):
    _same_logits(qwenc.load(f"{ST}@v1"), qwenc.load(models.st_v1))
    _same_logits(qwenc.load(f"{ST}@{hub.v1}"), qwenc.load(models.st_v1))
    _same_logits(qwenc.load(ST), qwenc.load(models.st_main))
    assert not np.array_equal(qwenc.load(models.st_v1).logits(IDS), qwenc.load(models.st_main).logits(IDS))
    hub.clear_log()
    qwenc.load(f"{ST}@{hub.v1}")  # a cached commit never changes: no need to ask
    assert hub.log == []
    with pytest.raises(ModelNotFound, match="no revision 'no-such-branch'"):
        qwenc.load(f"{ST}@no-such-branch")


def test_offline_without_the_model_says_how_to_get_it(online, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound) as exc:
        qwenc.load(GG + ":Q8_0")
    msg = str(exc.value)
    assert f"qwenc pull {GG}:Q8_0" in msg and "HF_HUB_OFFLINE" in msg and str(online.cache) in msg
    assert isinstance(exc.value, FileNotFoundError)
    assert hub.log == []


def test_offline_with_the_model_cached_asks_nothing(online, hub, models, monkeypatch):
    qwenc.load(ST)
    qwenc.load(GG + ":Q8_0")
    hub.clear_log()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _same_logits(qwenc.load(ST), qwenc.load(models.st_main))
    _same_logits(qwenc.load(GG + ":Q8_0"), qwenc.load(models.gguf["Q8_0"]))
    assert hub.log == []
    with pytest.raises(ModelNotFound, match="HF_HUB_OFFLINE"):
        qwenc.load(f"{ST}@v1")  # only main was fetched
    with pytest.raises(ModelNotFound, match="F16"):
        qwenc.load(GG + ":F16")  # another quantization of a cached repo: not cached
    assert hub.log == []


def test_offline_with_a_file_missing_names_it(online, hub, models, monkeypatch):
    qwenc.load(ST)
    snap = _snapshot(online.cache, ST, hub.main)
    (snap / models.shards[-1]).unlink()  # as an interrupted download would leave it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match=models.shards[-1]) as exc:
        qwenc.load(ST)
    assert f"qwenc pull {ST}" in str(exc.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.clear_log()
    _same_logits(qwenc.load(ST), qwenc.load(models.st_main))  # online again: the one file is fetched
    assert hub.files_requested() == {models.shards[-1]}


def test_an_unreachable_hub_falls_back_to_the_cache(online, hub, models, monkeypatch, capsys):
    qwenc.load(ST)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    _same_logits(qwenc.load(ST), qwenc.load(models.st_main))
    assert "could not be reached" in capsys.readouterr().err
    with pytest.raises(ModelNotFound, match="could not be reached") as exc:
        qwenc.load(GG)
    assert f"qwenc pull {GG}" in str(exc.value)


# ---------------------------------------------------------------- GGUF repositories

def test_gguf_repo_defaults_to_q4_k_m(online, hub, models):
    model = qwenc.load(GG)
    assert Path(model.source).name == "tiny-Q4_K_M.gguf"
    assert hub.files_requested() == {"tiny-Q4_K_M.gguf"}
    _same_logits(model, qwenc.load(models.gguf["Q4_K_M"]))


@pytest.mark.parametrize("tag,quant", [("Q8_0", "Q8_0"), ("q8_0", "Q8_0"), ("F16", "F16"), ("Q4_K_M", "Q4_K_M")])
def test_gguf_quantization_by_tag(online, hub, models, tag, quant):
    model = qwenc.load(f"{GG}:{tag}")
    assert hub.files_requested() == {f"tiny-{quant}.gguf"}
    _same_logits(model, qwenc.load(models.gguf[quant]))


def test_gguf_by_file_name(online, hub, models):
    _same_logits(qwenc.load(f"{GG}/tiny-F16.gguf"), qwenc.load(models.gguf["F16"]))
    assert hub.files_requested() == {"tiny-F16.gguf"}


def test_a_missing_quantization_lists_the_available_ones(online, hub):
    with pytest.raises(ModelNotFound) as exc:
        qwenc.load(f"{GG}:Q5_K_M")
    msg = str(exc.value)
    assert "no Q5_K_M" in msg
    for q in ("F16", "Q8_0", "Q4_K_M", "F32"):
        assert q in msg
    assert "mmproj" not in msg  # a vision projector is not a model
    assert hub.files_requested() == set()
    with pytest.raises(ModelNotFound, match="no file nope.gguf"):
        qwenc.load(f"{GG}/nope.gguf")


def test_several_quantizations_without_q4_k_m_must_be_chosen(online, hub, models):
    with pytest.raises(ModelNotFound, match="no Q4_K_M") as exc:
        qwenc.load("TinyOrg/no-default-GGUF")
    assert "F16" in str(exc.value) and "Q8_0" in str(exc.value) and ":QUANT" in str(exc.value)
    _same_logits(qwenc.load("TinyOrg/no-default-GGUF:F16"), qwenc.load(models.gguf["F16"]))


def test_split_gguf_is_fetched_whole_and_read_as_one(online, hub, models):
    model = qwenc.load(f"{GG}:F32")
    assert hub.files_requested() == set(models.split_names)
    assert Path(model.source).name == models.split_names[0]
    _same_logits(model, qwenc.load(models.f32))  # the same tensors in one file
    hub.clear_log()
    _same_logits(qwenc.load(f"{GG}/{models.split_names[1]}"), qwenc.load(models.f32))  # any part names it
    assert hub.files_requested() == set()


def test_an_interrupted_transfer_resumes(online, hub, models, monkeypatch):
    data = models.gguf["Q8_0"].read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    # huggingface_hub writes what it receives in 10 MB chunks; smaller ones put part of this small
    # file on disk before the cut, so that the retry has something to resume from.
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 16 << 10)
    hub.cut_once(data)
    model = qwenc.load(f"{GG}:Q8_0")
    gets = [r for r in hub.requests(server="storage", method="GET") if digest in r.path]
    assert len(gets) == 2, [(r.status, r.sent, r.headers.get("range")) for r in gets]
    first, second = gets
    assert first.status == 200 and first.sent == len(data) // 2
    resumed_at = int(second.headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= first.sent and second.status == 206
    assert second.sent == len(data) - resumed_at  # the rest, not the whole file again
    blob = Path(model.source).resolve()
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    _same_logits(model, qwenc.load(models.gguf["Q8_0"]))


def test_a_private_repo_needs_hf_token(online, hub, models, monkeypatch):
    with pytest.raises(ModelNotFound, match="HF_TOKEN"):
        qwenc.load(PRIVATE)
    assert {r.status for r in hub.log} == {401}
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ModelNotFound, match="no access"):
        qwenc.load(PRIVATE)
    hub.clear_log()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    _same_logits(qwenc.load(PRIVATE), qwenc.load(models.gguf["Q8_0"]))  # its only GGUF: taken
    hub_side = hub.requests(server="hub")
    assert hub_side and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in hub_side)
    storage = hub.requests(server="storage")
    assert storage and all("authorization" not in r.headers for r in storage)  # the token stays on the hub


def test_a_repo_without_weights_qwenc_reads_is_refused(online, hub):
    with pytest.raises(ModelFormatError, match="pytorch_model.bin"):
        qwenc.load("TinyOrg/pytorch-only")
    assert hub.files_requested() == set()


def test_an_unknown_repo(online, hub):
    with pytest.raises(ModelNotFound, match="has no repo TinyOrg/nothing-here"):
        qwenc.load("TinyOrg/nothing-here")


# ---------------------------------------------------------------- qwenc pull / qwenc models

def _qwenc(args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "qwenc", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_pull_then_offline_gen_in_a_fresh_process(online, hub, models):
    """In new processes, so that huggingface_hub reads the environment at import as it does for
    a user: HF_HOME and HF_ENDPOINT for the pull, HF_HUB_OFFLINE for the generation."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE", "QWENC_MODEL"))}
    env.update(HF_HOME=str(online.tmp / "hf"), HF_ENDPOINT=hub.url, QWENC_THREADS="1")
    pulled = _qwenc(["pull", f"{GG}:Q8_0"], env)
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip().splitlines()[-1])
    assert path == _snapshot(online.cache, GG, hub.repos[GG].refs["main"]) / "tiny-Q8_0.gguf"
    assert "tiny-Q8_0.gguf" in pulled.stderr and "100%" in pulled.stderr  # huggingface_hub's progress bar
    assert hub.files_requested() == {"tiny-Q8_0.gguf"}
    hub.clear_log()
    env["HF_HUB_OFFLINE"] = "1"
    gen = _qwenc(["gen", "-m", f"{GG}:Q8_0", "--temperature", "0", "-n", "6", "hello"], env)
    assert gen.returncode == 0, gen.stderr
    expected = qwenc.load(models.gguf["Q8_0"]).generate("hello", max_tokens=6, temperature=0)
    assert gen.stdout == expected + "\n"
    missing = _qwenc(["pull", f"{GG}:F16"], env)
    assert missing.returncode == 2 and "HF_HUB_OFFLINE" in missing.stderr
    assert hub.log == []


def _file_type_name(ft):
    name = gguf.LlamaFileType(ft).name
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def test_file_type_names_match_the_gguf_package():
    for ft in gguf.LlamaFileType:
        if ft is not gguf.LlamaFileType.GUESSED:
            assert catalog.FILE_TYPES[int(ft)] == _file_type_name(ft), ft


def test_models_lists_what_is_cached_from_the_headers(online, hub, models, monkeypatch, capsys):
    from safetensors import safe_open
    qwenc.load(ST)
    qwenc.load(f"{ST}@v1")
    qwenc.load(f"{GG}:Q8_0")
    qwenc.load(f"{GG}:F32")
    monkeypatch.setenv("QWENC_MODEL", str(models.gguf["F16"]))
    monkeypatch.setenv("QWENC_CACHE", str(online.tmp / "no-demos"))
    monkeypatch.setattr(catalog.demos, "part_paths", lambda model=None: None)
    found = {m.name: m for m in catalog.find_models()}
    assert set(found) == {ST, f"{ST}@v1", f"{GG}:Q8_0", f"{GG}:F32", str(models.gguf["F16"])}
    # GGUF entries against gguf's own reader of the same files.
    for name, path in ((f"{GG}:Q8_0", models.gguf["Q8_0"]), (str(models.gguf["F16"]), models.gguf["F16"]),
                       (f"{GG}:F32", models.f32)):
        ref = gguf.GGUFReader(path)
        m = found[name]
        assert m.arch == ref.fields["general.architecture"].contents() == "qwen2"
        assert m.context == ref.fields["qwen2.context_length"].contents() == 512
        assert m.quant == _file_type_name(ref.fields["general.file_type"].contents())
        assert m.params == sum(int(t.n_elements) for t in ref.tensors)
    assert found[f"{GG}:F32"].size == sum((models.split.parent / n).stat().st_size for n in models.split_names)
    assert found[str(models.gguf["F16"])].where == "QWENC_MODEL"
    # The safetensors entry against the safetensors package and config.json.
    m = found[ST]
    params = 0
    for shard in models.shards:
        with safe_open(str(models.st_main / shard), "np") as f:
            params += sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())
    assert (m.arch, m.params, m.quant, m.context) == ("qwen2", params, "F32", 512)
    assert m.size == sum(p.stat().st_size for p in _snapshot(online.cache, ST, hub.main).iterdir())
    assert cli_main(["models"]) == 0
    out = capsys.readouterr().out
    for name in found:
        assert name in out
    assert "not installed: demo-1.5b" in out and 'pip install "qwenc[demo-1-5b]"' in out


def cli_main(argv):
    from qwenc import cli
    return cli.main(argv)
