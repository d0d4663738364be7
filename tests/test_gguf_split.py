"""GGUF models split over several files (llama.cpp's gguf-split layout), read as one.

The gguf package's writer, in its split mode, is the oracle for the layout: every tensor of every
part must come out of qwenc's reader with the bytes, type and shape gguf's GGUFReader sees in that
part, the model must compute exactly what the same tensors in one file compute, and sets of
parts that do not fit together (a part missing, swapped, misnamed, a tensor twice, a wrong total)
must be refused with a GGUFError naming the file.
"""
import os

import numpy as np
import pytest

import qwenc
from qwenc.formats.gguf import GGUFError, GGUFSplit, gguf_to_hf, hf_tensor_name, open_gguf

from tinymodel import make_tiny, write_gguf

gguf = pytest.importorskip("gguf")
IDS = [5, 77, 300, 12, 199, 42, 260, 3, 150]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    model_dir = make_tiny(root / "hf", seed=11)
    single = write_gguf(model_dir, root / "one" / "tiny.gguf", "Q8_0")
    first = write_gguf(model_dir, root / "parts" / "tiny.gguf", "Q8_0", split_max_tensors=8)
    parts = sorted(first.parent.iterdir())
    return single, first, parts


def test_parts_read_as_one_model(split):
    single, first, parts = split
    assert [p.name for p in parts] == [f"tiny-{i:05d}-of-{len(parts):05d}.gguf" for i in range(1, len(parts) + 1)]
    gf = open_gguf(first)
    assert isinstance(gf, GGUFSplit) and gf.paths == [str(p) for p in parts]
    seen = {}
    for part in parts:
        ref = gguf.GGUFReader(part)
        for t in ref.tensors:
            assert t.name not in seen
            seen[t.name] = part
            assert gf.tensor_path(t.name) == str(part)
            assert gf.tensors[t.name].dtype == int(t.tensor_type)
            assert gf.tensors[t.name].shape == tuple(int(d) for d in t.shape)
            np.testing.assert_array_equal(gf.tensor_bytes(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))
    assert list(gf.tensors) == list(seen) == list(open_gguf(single).tensors)
    ref0 = gguf.GGUFReader(parts[0])
    assert gf.metadata["qwen2.block_count"] == ref0.fields["qwen2.block_count"].contents()
    assert gf.metadata["split.count"] == len(parts)
    _, tensors = gguf_to_hf(gf)
    for name, part in seen.items():  # each tensor names the file it lives in
        assert tensors[hf_tensor_name(name)].source == str(part)
    assert {t.source for t in tensors.values()} == {str(p) for p in parts}


def test_split_model_computes_what_one_file_computes(split):
    single, first, _ = split
    a = qwenc.load(first).logits(IDS, all_positions=True)
    assert np.abs(a).max() > 0.1
    np.testing.assert_array_equal(a, qwenc.load(single).logits(IDS, all_positions=True))


def test_parts_reached_through_links_named_by_hash(split, tmp_path):
    """In a HuggingFace cache each part is a link, named as in the repo, to a blob named by its
    hash: the other parts are found by the link's name, not the blob's."""
    single, first, parts = split
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snap").mkdir()
    for i, p in enumerate(parts):
        blob = tmp_path / "blobs" / f"{i:040x}"
        blob.write_bytes(p.read_bytes())
        os.symlink(os.path.relpath(blob, tmp_path / "snap"), tmp_path / "snap" / p.name)
    np.testing.assert_array_equal(qwenc.load(tmp_path / "snap" / parts[0].name).logits(IDS),
                                  qwenc.load(single).logits(IDS))


def _copy(parts, folder, names=None):
    folder.mkdir()
    out = []
    for p, name in zip(parts, names or [p.name for p in parts]):
        (folder / name).write_bytes(p.read_bytes())
        out.append(folder / name)
    return out


def test_a_missing_part(split, tmp_path):
    _, _, parts = split
    copied = _copy(parts, tmp_path / "m")
    copied[-1].unlink()
    with pytest.raises(GGUFError, match=f"part {len(parts)} of {len(parts)} is missing"):
        open_gguf(copied[0])


def test_a_later_part_is_not_a_model(split):
    _, _, parts = split
    with pytest.raises(GGUFError, match=f"part 2 of a model split over {len(parts)} files.*tiny-00001-of-"):
        qwenc.load(parts[1])


def test_swapped_parts(split, tmp_path):
    _, _, parts = split
    names = [p.name for p in parts]
    names[1], names[2] = names[2], names[1]
    copied = _copy(parts, tmp_path / "s", names)
    with pytest.raises(GGUFError, match=f"expected split part 2 of {len(parts)}, the header says part 3"):
        open_gguf(copied[0])


def test_a_misnamed_first_part(split, tmp_path):
    _, _, parts = split
    copied = _copy(parts, tmp_path / "n", ["model.gguf"] + [p.name for p in parts[1:]])
    with pytest.raises(GGUFError, match="must be named NAME-00001-of-"):
        open_gguf(copied[0])


def _write_parts(folder, plan, total=None):
    """Parts written by hand: plan is a list of tensor-name lists, one per part; split keys set
    as gguf-split sets them, with `total` overriding split.tensors.count."""
    folder.mkdir()
    count = len(plan)
    total = sum(len(p) for p in plan) if total is None else total
    paths = []
    for i, names in enumerate(plan):
        path = folder / f"m-{i + 1:05d}-of-{count:05d}.gguf"
        w = gguf.GGUFWriter(str(path), "qwen2")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", count)
        w.add_int32("split.tensors.count", total)
        for name in names:
            w.add_tensor(name, np.arange(32, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(path)
    return paths


def test_a_tensor_in_two_parts(tmp_path):
    paths = _write_parts(tmp_path / "d", [["a", "b"], ["b", "c"]])
    with pytest.raises(GGUFError, match="tensor 'b' is also in"):
        open_gguf(paths[0])


def test_a_wrong_tensor_total(tmp_path):
    paths = _write_parts(tmp_path / "t", [["a", "b"], ["c"]], total=4)
    with pytest.raises(GGUFError, match="hold 3 tensors, the header says 4"):
        open_gguf(paths[0])
    good = _write_parts(tmp_path / "g", [["a", "b"], ["c"]])
    assert list(open_gguf(good[0]).tensors) == ["a", "b", "c"]


def test_split_count_of_one_is_a_plain_file(tmp_path):
    path = _write_parts(tmp_path / "one", [["a"]])[0]
    assert not isinstance(open_gguf(path), GGUFSplit)
