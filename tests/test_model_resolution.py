"""What `qwenc.load` and the CLI's `-m` accept, and how the demo models get onto the disk.

One small random model is stored three ways: a HuggingFace directory, a GGUF file holding the
same float32 weights and tokenizer, and a hub repo id in a fake HuggingFace cache, looked up with
HF_HUB_OFFLINE set (downloads are tests/test_hub.py's). All three must give bit-identical logits
and the same CLI output. Then the failures a user meets first: a repo id that is not cached, no
model at all, and a demo assembly that is short or corrupt (refused, with nothing half-written
left behind); and the demo table against the extras that install it.
"""
import dataclasses
import hashlib
import io
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
from tinymodel import ADDED, MERGES, make_tiny, write_gguf

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

REPO_ID = "TinyOrg/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """These tests are about the cache: HF_HUB_OFFLINE, so no lookup ever leaves the machine."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


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
    model_dir = make_tiny(root / "hf", seed=5)
    gguf_path = write_gguf(model_dir, root / "tiny.gguf")
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
    assert "qwenc pull NoSuchOrg/no-model" in str(exc.value) and "HF_HUB_OFFLINE" in str(exc.value)
    assert isinstance(exc.value, qwenc.errors.ModelNotFound)


def test_not_a_hub_id_nor_a_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a hub id") as exc:
        qwenc.load("some/dir/model.bin")
    assert "OWNER/REPO:QUANT" in str(exc.value)


def test_repo_with_dangling_ref_and_no_snapshot(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--Org--broken"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="Org/broken"):
        qwenc.load("Org/broken")


def test_a_cached_snapshot_without_weights(tiny, tmp_path, monkeypatch):
    """Only config.json cached (a download cut short): offline, that is a model not yet fetched."""
    src = tmp_path / "partial"
    src.mkdir()
    shutil.copy(tiny[0] / "config.json", src / "config.json")
    fake_hub_snapshot(tmp_path / "hub3", "Org/partial", COMMIT, src)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub3"))
    with pytest.raises(FileNotFoundError, match="holds no model qwenc can load .config.json.") as exc:
        qwenc.load("Org/partial")
    assert "qwenc pull Org/partial" in str(exc.value)


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
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda model=None: None)
    for command in (["gen", "hi"], ["chat"], ["bench"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(command)
        message = str(exc.value.code)  # a string code: Python prints it and exits with status 1
        assert message.startswith("qwenc: no model given"), message
        assert 'pip install "qwenc[demo]"' in message and "-m PATH" in message
        assert "hub repo id" in message and "demo-1.5b" in message
    assert list(cache.iterdir()) == []  # nothing assembled, nothing half-written


# ---------------------------------------------------------------- demo assembly

@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three small part files and a demo entry whose size and SHA-256 are their concatenation's."""
    rng = np.random.default_rng(0)
    blobs = [b"GGUF" + rng.bytes(1000), rng.bytes(1), rng.bytes(70_000)]
    parts = []
    for i, blob in enumerate(blobs, start=1):
        p = tmp_path / "parts" / f"part{i:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(blob)
        parts.append(p)
    whole = b"".join(blobs)
    fake = dataclasses.replace(qwenc.formats.demo.DEMOS["demo"], size=len(whole),
                               sha256=hashlib.sha256(whole).hexdigest())
    return parts, whole, fake


def test_assemble_concatenates_in_order(fake_parts, tmp_path):
    parts, whole, fake = fake_parts
    target = tmp_path / "cache" / "model.gguf"
    progress = io.StringIO()
    assert qwenc.formats.demo.assemble(parts, target, fake, progress=progress) == target
    assert target.read_bytes() == whole
    assert list(target.parent.iterdir()) == [target]
    assert progress.getvalue().endswith("\n") and "assembling demo model" in progress.getvalue()


def test_assemble_refuses_wrong_size(fake_parts, tmp_path):
    parts, whole, fake = fake_parts
    fake = dataclasses.replace(fake, size=len(whole) + 1)
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match=f"{len(whole)} bytes, expected {len(whole) + 1}"):
        qwenc.formats.demo.assemble(parts, target, fake, progress=None)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_assemble_refuses_wrong_hash_and_leaves_nothing(fake_parts, tmp_path):
    parts, whole, fake = fake_parts
    fake = dataclasses.replace(fake, sha256=hashlib.sha256(whole[:-1] + b"x").hexdigest())
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match="SHA-256") as exc:
        qwenc.formats.demo.assemble(parts, target, fake, progress=None)
    assert 'pip install --force-reinstall "qwenc[demo]"' in str(exc.value)
    assert list(target.parent.iterdir()) == []  # the partial file is gone


def test_failed_assembly_keeps_an_existing_file(fake_parts, tmp_path):
    parts, whole, fake = fake_parts
    target = tmp_path / "cache" / "model.gguf"
    target.parent.mkdir()
    target.write_bytes(b"previous")
    with pytest.raises(qwenc.formats.demo.DemoModelMissing):
        qwenc.formats.demo.assemble(parts, target, dataclasses.replace(fake, sha256="0" * 64), progress=None)
    assert target.read_bytes() == b"previous"
    assert list(target.parent.iterdir()) == [target]


def test_a_corrupted_part_is_caught_by_the_hash(fake_parts, tmp_path):
    """Same size, one flipped byte: only the hash can tell."""
    parts, whole, fake = fake_parts
    data = bytearray(parts[2].read_bytes())
    data[12345] ^= 0xFF
    parts[2].write_bytes(bytes(data))
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match="SHA-256"):
        qwenc.formats.demo.assemble(parts, target, fake, progress=None)
    assert not target.exists()


@pytest.mark.parametrize("name", ["demo", "demo-1.5b"])
def test_demo_model_path_assembles_once(fake_parts, tmp_path, monkeypatch, name):
    parts, whole, fake = fake_parts
    fake = dataclasses.replace(fake, name=name, filename=f"{name}.gguf")
    monkeypatch.setitem(qwenc.formats.demo.DEMOS, name, fake)
    monkeypatch.setenv("QWENC_CACHE", str(tmp_path / "qc"))
    calls = []
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda model: calls.append(model.name) or parts)
    path = qwenc.formats.demo.demo_model_path(progress=None, name=name)
    assert path == tmp_path / "qc" / f"{name}.gguf" and path.read_bytes() == whole
    assert qwenc.formats.demo.demo_model_path(progress=None, name=name) == path
    assert resolve_model_path(name) == path  # -m demo / -m demo-1.5b
    assert calls == [name]  # later calls found the assembled file and did not touch the parts


def test_demo_model_path_without_parts(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENC_CACHE", str(tmp_path / "qc"))
    monkeypatch.setattr(qwenc.formats.demo, "part_paths", lambda model=None: None)
    with pytest.raises(FileNotFoundError, match="pip install"):
        qwenc.formats.demo.demo_model_path(progress=None)
    with pytest.raises(qwenc.formats.demo.DemoModelMissing, match=r'pip install "qwenc\[demo-1.5b\]"'):
        qwenc.load("demo-1.5b")


def test_part_paths_finds_installed_parts_in_order(tmp_path, monkeypatch):
    """Parts are found as installed packages (<pkg>/data/partNN.bin), in the table's order; one
    missing package means the demo is not installed."""
    pkgs = [f"qwenc_fake_part{i}" for i in range(1, 4)]
    for i, pkg in enumerate(pkgs, start=1):
        (tmp_path / pkg / "data").mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "data" / f"part{i:02d}.bin").write_bytes(b"x" * i)
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = dataclasses.replace(qwenc.formats.demo.DEMOS["demo"], packages=tuple(pkgs))
    assert qwenc.formats.demo.part_paths(fake) == [tmp_path / p / "data" / f"part{i:02d}.bin"
                                                    for i, p in enumerate(pkgs, start=1)]
    assert qwenc.formats.demo.part_paths(dataclasses.replace(fake, packages=tuple(pkgs) + ("qwenc_no_such",))) is None
    shutil.rmtree(tmp_path / pkgs[1] / "data")
    assert qwenc.formats.demo.part_paths(fake) is None


def test_demo_table_matches_the_extras_that_install_it():
    """Each demo's parts are exactly the packages its pip extra pins, in order, so that
    `pip install "qwenc[NAME]"` installs what `-m NAME` looks for."""
    import tomllib
    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    for name, model in qwenc.formats.demo.DEMOS.items():
        pins = [req.split("==") for req in extras[model.extra]]
        assert all(len(p) == 2 for p in pins), extras[model.extra]  # pinned: the hash is of one release
        assert [pkg.replace("-", "_") for pkg, _ in pins] == list(model.packages), name
    assert qwenc.formats.demo.DEMOS["demo-1.5b"].size == 1_117_320_768


def test_cli_rope_scaling_reaches_the_model(tiny, capsys):
    """`--rope-scaling JSON` is load(rope_scaling=...): the same text as the API gives with it,
    on a GGUF whose header says nothing of scaling."""
    import json as _json
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    code, out, err = run_main(capsys, "gen", "-m", str(tiny[1]), "--rope-scaling", _json.dumps(yarn),
                              "--temperature", "0", "-n", "12", "hello there")
    assert code == 0, err
    want = qwenc.load(tiny[1], rope_scaling=yarn).generate("hello there", max_tokens=12, temperature=0)
    assert out == want + "\n"
    code, out2, err = run_main(capsys, "gen", "-m", str(tiny[1]), "--temperature", "0", "-n", "12", "hello there")
    assert out2 == qwenc.load(tiny[1]).generate("hello there", max_tokens=12, temperature=0) + "\n"
    assert out != out2  # the scaling did reach the model
