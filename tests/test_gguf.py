"""GGUF reader against the gguf package (GGUFReader / GGUFWriter as oracle), the HF mapping, and
corrupt files (each must raise GGUFError naming the file, never crash or hang)."""
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

from qwenc.formats.gguf import GGML_TYPES, GGUFError, gguf_to_hf, hf_tensor_name, open_gguf  # noqa: E402
from qwenc.formats.tensors import F16, F32, Q8_0, Tensor  # noqa: E402


# ---------------------------------------------------------------- the demo file vs GGUFReader

@pytest.fixture(scope="module")
def demo_pair(demo_gguf):
    """(our reader, gguf's reader) on the demo file; the latter takes a few seconds."""
    return open_gguf(demo_gguf), gguf.GGUFReader(demo_gguf)


def test_demo_metadata_equals_gguf_reader(demo_pair):
    ours, ref = demo_pair
    ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == ref_keys
    for key in ref_keys:
        field = ref.fields[key]
        assert ours.value_types[key] == field.types[0], key
        assert ours.metadata[key] == field.contents(), key
    assert ours.version == ref.fields["GGUF.version"].contents() == 3
    assert ours.alignment == ref.alignment and ours.data_offset == ref.data_offset


def test_demo_token_arrays(demo_pair):
    ours, _ = demo_pair
    tokens = ours.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 151936 and all(isinstance(t, str) for t in tokens[:1000])
    assert tokens[151645] == "<|im_end|>"
    assert len(ours.metadata["tokenizer.ggml.merges"]) == 151387
    assert set(ours.metadata["tokenizer.ggml.token_type"]) <= {1, 2, 3, 4, 5, 6}


def test_demo_tensor_table_equals_gguf_reader(demo_pair):
    ours, ref = demo_pair
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.dtype == int(t.tensor_type), t.name
        assert info.shape == tuple(int(d) for d in t.shape), t.name
        assert info.offset == t.data_offset, t.name
        assert info.nbytes == t.n_bytes, t.name


def test_demo_tensor_bytes_are_views_of_the_same_data(demo_pair):
    ours, ref = demo_pair
    for t in ref.tensors[:40]:
        view = ours.tensor_bytes(t.name)
        assert view.dtype == np.uint8 and not view.flags.writeable and not view.flags.owndata
        np.testing.assert_array_equal(view, np.asarray(t.data).view(np.uint8).reshape(-1))


def test_demo_to_hf(demo_pair):
    ours, _ = demo_pair
    config, tensors = gguf_to_hf(ours)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    expect = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, rope_theta=1e6, rms_norm_eps=1e-6, vocab_size=151936,
                  max_position_embeddings=32768, head_dim=64, tie_word_embeddings=False,
                  attention_bias=True, torch_dtype="float32")
    assert {k: config[k] for k in expect} == expect
    assert "rope_scaling" not in config
    assert len(tensors) == len(ours.tensors) == 291
    emb = tensors["model.embed_tokens.weight"]
    assert emb.shape == (151936, 896) and emb.dtype_name == "Q5_0"
    assert tensors["lm_head.weight"].shape == (151936, 896) and tensors["lm_head.weight"].dtype == Q8_0
    down = tensors["model.layers.0.mlp.down_proj.weight"]
    assert down.shape == (896, 4864) and down.dtype_name == "Q6_K"
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (128, 896)
    assert tensors["model.layers.23.self_attn.q_proj.bias"].shape == (896,)
    assert tensors["model.layers.0.post_attention_layernorm.weight"].dtype == F32
    # every tensor got an HF name: none is left under its GGUF name
    assert not [n for n in tensors if n.startswith(("blk.", "token_embd", "output"))]
    for t in tensors.values():
        assert isinstance(t, Tensor) and t.data.nbytes == ours.tensors[_gguf_name(t.name, ours)].nbytes


def _gguf_name(hf, gf):
    return next(n for n in gf.tensors if hf_tensor_name(n) == hf)


def test_ggml_type_table_matches_gguf_package():
    for code, (name, block, nbytes) in GGML_TYPES.items():
        assert GT(code).name == name
        assert gguf.GGML_QUANT_SIZES[GT(code)] == (block, nbytes), name


# ---------------------------------------------------------------- synthetic files

QWEN3 = dict(hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=96, layers=2, vocab=50)


def write_qwen3(path, tied=True, with_scaling=False, alignment=None, scaling_extra=None):
    """A small qwen3 GGUF written by gguf's writer: every metadata value type, q/k norms, F32, F16
    and Q8_0 tensors. Returns (metadata expected back, {gguf name: (type, numpy data)})."""
    cfg = QWEN3
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3")
    meta = {
        "general.architecture": "qwen3",
        "qwen3.block_count": cfg["layers"], "qwen3.context_length": 4096,
        "qwen3.embedding_length": cfg["hidden"], "qwen3.feed_forward_length": cfg["ffn"],
        "qwen3.attention.head_count": cfg["heads"], "qwen3.attention.head_count_kv": cfg["kv_heads"],
        "qwen3.attention.key_length": cfg["head_dim"], "qwen3.attention.value_length": cfg["head_dim"],
    }
    w.add_block_count(cfg["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(cfg["hidden"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    meta["qwen3.rope.freq_base"] = float(np.float32(1e6))
    meta["qwen3.attention.layer_norm_rms_epsilon"] = float(np.float32(1e-6))
    if with_scaling:
        w.add_string("qwen3.rope.scaling.type", "yarn")
        w.add_float32("qwen3.rope.scaling.factor", 4.0)
        w.add_uint32("qwen3.rope.scaling.original_context_length", 32768)
        meta.update({"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
                     "qwen3.rope.scaling.original_context_length": 32768})
        for key, value in (scaling_extra or {}).items():
            w.add_float32(f"qwen3.rope.scaling.{key}", value)
            meta[f"qwen3.rope.scaling.{key}"] = value
    if alignment:
        w.add_custom_alignment(alignment)
        meta["general.alignment"] = alignment
    # one key of every value type, including arrays of arrays and strings that need escaping
    extra = [
        ("test.u8", 250, VT.UINT8), ("test.i8", -100, VT.INT8), ("test.u16", 65000, VT.UINT16),
        ("test.i16", -32000, VT.INT16), ("test.u32", 4_000_000_000, VT.UINT32), ("test.i32", -2_000_000_000, VT.INT32),
        ("test.f32", 0.5, VT.FLOAT32), ("test.bool", True, VT.BOOL), ("test.string", "héllo ✓ \x00 end", VT.STRING),
        ("test.u64", 2**63 + 5, VT.UINT64), ("test.i64", -(2**62), VT.INT64), ("test.f64", 1e-300, VT.FLOAT64),
    ]
    for key, val, vt in extra:
        w.add_key_value(key, val, vt)
        meta[key] = val
    arrays = [
        ("test.arr_i32", [1, -2, 3], VT.INT32), ("test.arr_f64", [0.25, -1e100], VT.FLOAT64),
        ("test.arr_bool", [True, False, True], VT.BOOL), ("test.arr_u64", [2**64 - 1, 0], VT.UINT64),
        ("test.arr_str", ["a", "", "Ġhello", "<|im_end|>", "日本"], VT.STRING),
    ]
    for key, val, vt in arrays:
        w.add_key_value(key, val, VT.ARRAY, sub_type=vt)
        meta[key] = val
    w.add_array("test.nested", [[1, 2], [3], [4, 5, 6]])
    meta["test.nested"] = [[1, 2], [3], [4, 5, 6]]
    w.add_array("test.nested_str", [["x", "y"], ["z"]])
    meta["test.nested_str"] = [["x", "y"], ["z"]]

    tensors = {}

    def add(name, arr, raw=None):
        if raw is None:
            w.add_tensor(name, arr)
            tensors[name] = (F32 if arr.dtype == np.float32 else F16, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
            tensors[name] = (int(raw), arr)

    h, hd, ffn = cfg["hidden"], cfg["head_dim"], cfg["ffn"]
    add("token_embd.weight", rng.standard_normal((cfg["vocab"], h)).astype(np.float16))
    add("output_norm.weight", rng.uniform(0.5, 1.5, h).astype(np.float32))
    if not tied:
        q8 = gguf.quants.quantize(rng.standard_normal((cfg["vocab"], h)).astype(np.float32), GT.Q8_0)
        add("output.weight", q8, raw=GT.Q8_0)
    for i in range(cfg["layers"]):
        add(f"blk.{i}.attn_norm.weight", rng.uniform(0.5, 1.5, h).astype(np.float32))
        add(f"blk.{i}.attn_q.weight", rng.standard_normal((cfg["heads"] * hd, h)).astype(np.float32))
        add(f"blk.{i}.attn_k.weight", rng.standard_normal((cfg["kv_heads"] * hd, h)).astype(np.float16))
        add(f"blk.{i}.attn_v.weight", rng.standard_normal((cfg["kv_heads"] * hd, h)).astype(np.float16))
        add(f"blk.{i}.attn_output.weight", rng.standard_normal((h, cfg["heads"] * hd)).astype(np.float32))
        add(f"blk.{i}.attn_q_norm.weight", rng.uniform(0.5, 1.5, hd).astype(np.float32))
        add(f"blk.{i}.attn_k_norm.weight", rng.uniform(0.5, 1.5, hd).astype(np.float32))
        add(f"blk.{i}.ffn_norm.weight", rng.uniform(0.5, 1.5, h).astype(np.float32))
        add(f"blk.{i}.ffn_gate.weight", rng.standard_normal((ffn, h)).astype(np.float16))
        add(f"blk.{i}.ffn_up.weight", rng.standard_normal((ffn, h)).astype(np.float16))
        add(f"blk.{i}.ffn_down.weight", rng.standard_normal((h, ffn)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta, tensors


@pytest.fixture
def qwen3_file(tmp_path):
    path = tmp_path / "tiny-qwen3.gguf"
    meta, tensors = write_qwen3(path)
    return path, meta, tensors


def test_synthetic_v3_reads_back(qwen3_file):
    path, meta, tensors = qwen3_file
    gf = open_gguf(path)
    assert gf.version == 3 and gf.path == str(path)
    assert gf.metadata == meta
    assert isinstance(gf.metadata["test.bool"], bool) and isinstance(gf.metadata["test.u64"], int)
    assert gf.value_types["test.nested"] == VT.ARRAY and gf.value_types["test.f64"] == VT.FLOAT64
    assert list(gf.tensors) == list(tensors)
    for name, (dtype, arr) in tensors.items():
        info = gf.tensors[name]
        assert info.dtype == dtype
        if dtype == Q8_0:
            assert info.shape == (arr.shape[1] // 34 * 32, arr.shape[0])
        else:
            assert info.shape == tuple(reversed(arr.shape))
        np.testing.assert_array_equal(gf.tensor_bytes(name), arr.view(np.uint8).reshape(-1))
        assert info.offset % gf.alignment == 0


def test_synthetic_agrees_with_gguf_reader(qwen3_file):
    path, _, _ = qwen3_file
    ours, ref = open_gguf(path), gguf.GGUFReader(str(path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF.") or key.startswith("test.nested"):
            continue  # GGUFReader flattens nested arrays
        assert ours.metadata[key] == field.contents(), key
    for t in ref.tensors:
        assert ours.tensors[t.name].offset == t.data_offset
        assert ours.tensors[t.name].shape == tuple(int(d) for d in t.shape)


def test_synthetic_qwen3_to_hf(qwen3_file):
    path, _, tensors = qwen3_file
    config, hf = gguf_to_hf(open_gguf(path))
    c = QWEN3
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == c["head_dim"] != c["hidden"] // c["heads"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == \
        (c["hidden"], c["layers"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"])
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in hf
    assert config["attention_bias"] is False
    assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 1e6
    qn = hf["model.layers.1.self_attn.q_norm.weight"]
    assert qn.shape == (c["head_dim"],) and qn.dtype == F32
    np.testing.assert_array_equal(qn.to_f32(), tensors["blk.1.attn_q_norm.weight"][1])
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    assert k.shape == (c["kv_heads"] * c["head_dim"], c["hidden"]) and k.dtype == F16
    np.testing.assert_array_equal(k.to_f32(), tensors["blk.0.attn_k.weight"][1].astype(np.float32))
    assert hf["model.layers.0.mlp.down_proj.weight"].shape == (c["hidden"], c["ffn"])
    assert set(hf) == {hf_tensor_name(n) for n in tensors}
    assert hf["model.embed_tokens.weight"].source == str(path)


def test_untied_and_rope_scaling(tmp_path):
    path = tmp_path / "untied.gguf"
    _, tensors = write_qwen3(path, tied=False, with_scaling=True)
    config, hf = gguf_to_hf(open_gguf(path))
    assert config["tie_word_embeddings"] is False
    head = hf["lm_head.weight"]
    assert head.dtype == Q8_0 and head.shape == (QWEN3["vocab"], QWEN3["hidden"])
    want = gguf.quants.dequantize(tensors["output.weight"][1], GT.Q8_0)
    np.testing.assert_array_equal(head.to_f32(), want)
    assert config["rope_scaling"] == {"rope_type": "yarn", "type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 32768}


def test_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    _, tensors = write_qwen3(path, alignment=64)
    gf = open_gguf(path)
    assert gf.alignment == 64 and gf.data_offset % 64 == 0
    for name, (_, arr) in tensors.items():
        assert gf.tensors[name].offset % 64 == 0
        np.testing.assert_array_equal(gf.tensor_bytes(name), arr.view(np.uint8).reshape(-1))


def test_version_2_file(qwen3_file, tmp_path):
    """v2 has the same layout as v3 (u64 counts and lengths; v1 had u32): GGUFWriter only writes
    v3, so a v2 file is the same bytes with the version field set to 2."""
    path, meta, tensors = qwen3_file
    raw = bytearray(path.read_bytes())
    assert struct.unpack_from("<I", raw, 4)[0] == 3
    struct.pack_into("<I", raw, 4, 2)
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(raw))
    gf = open_gguf(v2)
    assert gf.version == 2 and gf.metadata == meta and list(gf.tensors) == list(tensors)
    assert gguf.GGUFReader(str(v2)).fields["GGUF.version"].contents() == 2


def hand_made(kv=b"", n_kv=0, tensors=b"", n_tensors=0, data=b"", version=3, magic=b"GGUF"):
    """A GGUF assembled from raw parts (header, metadata, tensor table, padding, data)."""
    head = magic + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + tensors
    return head + b"\0" * (-len(head) % 32) + data


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def test_empty_arrays_and_non_utf8_strings(tmp_path):
    kv = (gstr("a.empty") + struct.pack("<IIQ", VT.ARRAY, VT.INT32, 0)
          + gstr("a.empty_str") + struct.pack("<IIQ", VT.ARRAY, VT.STRING, 0)
          + gstr("a.raw") + struct.pack("<I", VT.STRING) + gstr(b"\xff\xfeok"))
    path = tmp_path / "hand.gguf"
    path.write_bytes(hand_made(kv, 3))
    gf = open_gguf(path)
    assert gf.metadata["a.empty"] == [] and gf.metadata["a.empty_str"] == []
    # kept exactly: the original bytes come back with surrogateescape
    assert gf.metadata["a.raw"].encode("utf-8", "surrogateescape") == b"\xff\xfeok"
    assert gf.tensors == {}


# ---------------------------------------------------------------- corrupt files

def expect_error(path, match):
    with pytest.raises(GGUFError, match=match) as info:
        open_gguf(path)
    assert path.name in str(info.value)


def corrupt(tmp_path, name, raw):
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def test_bad_magic(qwen3_file, tmp_path):
    raw = qwen3_file[0].read_bytes()
    expect_error(corrupt(tmp_path, "magic.gguf", b"GGML" + raw[4:]), "not a GGUF")
    expect_error(corrupt(tmp_path, "text.gguf", b"hello world, this is not a model\n"), "not a GGUF")


def test_empty_and_tiny_files(tmp_path):
    expect_error(corrupt(tmp_path, "empty.gguf", b""), "empty")
    expect_error(corrupt(tmp_path, "tiny.gguf", b"GG"), "truncated")
    expect_error(corrupt(tmp_path, "magic-only.gguf", b"GGUF"), "truncated")


def test_unsupported_versions(qwen3_file, tmp_path):
    raw = bytearray(qwen3_file[0].read_bytes())
    for version in (1, 4, 999):
        struct.pack_into("<I", raw, 4, version)
        expect_error(corrupt(tmp_path, f"v{version}.gguf", bytes(raw)), f"version {version}")
    struct.pack_into("<I", raw, 4, 3 << 16)  # a big-endian file's version as read little-endian
    expect_error(corrupt(tmp_path, "be.gguf", bytes(raw)), "big-endian")


def test_truncated_header_at_every_stage(qwen3_file, tmp_path):
    raw = qwen3_file[0].read_bytes()
    data_start = open_gguf(qwen3_file[0]).data_offset
    # cut in the counts, in the metadata, in the tensor table
    for cut in sorted({8, 20, 30, 100, 500, 1000, data_start - 40, data_start - 1}):
        expect_error(corrupt(tmp_path, f"cut{cut}.gguf", raw[:cut]), "truncated")


def test_truncated_tensor_data(qwen3_file, tmp_path):
    raw = qwen3_file[0].read_bytes()
    expect_error(corrupt(tmp_path, "short-data.gguf", raw[:-100]), "beyond the end")


def test_tensor_offset_out_of_bounds(tmp_path):
    table = gstr("t.weight") + struct.pack("<IQQIQ", 2, 32, 2, F32, 1 << 40)
    expect_error(corrupt(tmp_path, "far.gguf", hand_made(tensors=table, n_tensors=1, data=b"\0" * 256)),
                 "beyond the end")


def test_unknown_value_type(tmp_path):
    kv = gstr("x.key") + struct.pack("<I", 13) + b"\0" * 8
    expect_error(corrupt(tmp_path, "vtype.gguf", hand_made(kv, 1)), "unknown metadata value type 13")
    kv = gstr("x.arr") + struct.pack("<IIQ", VT.ARRAY, 77, 1) + b"\0" * 8
    expect_error(corrupt(tmp_path, "atype.gguf", hand_made(kv, 1)), "unknown metadata array element type 77")


def test_unknown_tensor_type_and_bad_shapes(tmp_path):
    def one_tensor(dims, dtype, offset=0):
        return gstr("t.weight") + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) \
            + struct.pack("<IQ", dtype, offset)
    cases = {
        "ttype": (one_tensor([32, 2], 99), "unknown GGML type 99"),
        "dims0": (gstr("t.weight") + struct.pack("<I", 0) + struct.pack("<IQ", F32, 0), "dimensions"),
        "dims9": (one_tensor([1] * 9, F32), "dimensions"),
        "rowlen": (one_tensor([33, 2], Q8_0), "not a multiple"),
        "misaligned": (one_tensor([8], F32, offset=4), "alignment"),
    }
    for name, (table, match) in cases.items():
        expect_error(corrupt(tmp_path, f"{name}.gguf", hand_made(tensors=table, n_tensors=1, data=b"\0" * 512)), match)


def test_duplicates_and_bad_alignment(tmp_path):
    kv = (gstr("k") + struct.pack("<II", VT.UINT32, 1)) * 2
    expect_error(corrupt(tmp_path, "dupkey.gguf", hand_made(kv, 2)), "duplicate metadata key")
    kv = gstr("general.alignment") + struct.pack("<II", VT.UINT32, 48)
    expect_error(corrupt(tmp_path, "align.gguf", hand_made(kv, 1)), "power-of-two")


def test_huge_counts_fail_fast(tmp_path):
    """Counts far beyond the file size must end in a truncation error, not a huge allocation."""
    kv = gstr("big.arr") + struct.pack("<IIQ", VT.ARRAY, VT.UINT64, 2**61)
    expect_error(corrupt(tmp_path, "bigarr.gguf", hand_made(kv, 1)), "truncated")
    kv = gstr("big.str") + struct.pack("<IQ", VT.STRING, 2**63)
    expect_error(corrupt(tmp_path, "bigstr.gguf", hand_made(kv, 1)), "truncated")
    expect_error(corrupt(tmp_path, "bigcount.gguf", hand_made(n_kv=2**62)), "truncated")
    kv = gstr("big.sarr") + struct.pack("<IIQ", VT.ARRAY, VT.STRING, 2**60) + gstr("a")
    expect_error(corrupt(tmp_path, "bigsarr.gguf", hand_made(kv, 1)), "truncated")


def test_random_corruption_never_crashes(qwen3_file, tmp_path):
    """Flipped bytes anywhere in the header: the file reads, or fails with GGUFError."""
    raw = qwen3_file[0].read_bytes()
    header_end = open_gguf(qwen3_file[0]).data_offset
    rng = np.random.default_rng(123)
    path = tmp_path / "fuzz.gguf"
    for _ in range(300):
        buf = bytearray(raw)
        for pos in rng.integers(0, header_end, size=rng.integers(1, 4)):
            buf[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(buf))
        try:
            open_gguf(path)
        except GGUFError as exc:
            assert path.name in str(exc)


def test_missing_file():
    with pytest.raises(GGUFError, match="no-such-file.gguf"):
        open_gguf("/nonexistent-dir/no-such-file.gguf")


def test_unsupported_architecture(tmp_path):
    kv = gstr("general.architecture") + struct.pack("<I", VT.STRING) + gstr("llama")
    gf = open_gguf(corrupt(tmp_path, "llama.gguf", hand_made(kv, 1)))
    with pytest.raises(GGUFError, match="architecture 'llama' is not supported"):
        gguf_to_hf(gf)


@pytest.mark.parametrize("rope", [
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, rope_theta=10000.0),
    dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=20, beta_fast=8.0, beta_slow=2.0,
         rope_theta=10000.0),
    dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
])
def test_rope_scaling_computes_what_the_directory_computes(rope, tmp_path):
    """A GGUF with llama.cpp's RoPE scaling keys runs the scaling its HF directory runs (which
    test_parity.py holds to transformers), and differs from the file without them."""
    import qwenc
    from tinymodel import make_tiny, write_gguf
    model_dir = make_tiny(tmp_path / "hf", seed=4, rope_parameters=rope)
    path = write_gguf(model_dir, tmp_path / "scaled.gguf", "F32")
    ids = [5, 77, 200, 12, 199, 42, 260, 3, 150] * 4
    ours = qwenc.load(path).logits(ids, all_positions=True)
    np.testing.assert_allclose(ours, qwenc.load(model_dir).logits(ids, all_positions=True), atol=1e-6, rtol=0)
    plain = make_tiny(tmp_path / "plain", seed=4)
    assert np.abs(ours - qwenc.load(plain).logits(ids, all_positions=True)).max() > 1e-2
    assert qwenc.load(path).config.rope_scaling.kind == rope["rope_type"]


@pytest.mark.parametrize("key,value,refused", [
    ("attn_factor", 2.0, True), ("yarn_attn_factor", 1.5, True), ("yarn_ext_factor", 0.5, True),
    ("yarn_log_multiplier", 0.1, True),
    ("attn_factor", 1.0, False), ("yarn_ext_factor", -1.0, False), ("yarn_log_multiplier", 0.0, False),
])
def test_llama_cpp_yarn_knobs(key, value, refused, tmp_path):
    """llama.cpp's own YaRN settings mean something other than transformers' attention_factor:
    refused where they would change the result, read where they change nothing."""
    path = tmp_path / "q.gguf"
    write_qwen3(path, with_scaling=True, scaling_extra={key: value})
    if refused:
        with pytest.raises(GGUFError, match=key):
            gguf_to_hf(open_gguf(path))
    else:
        assert gguf_to_hf(open_gguf(path))[0]["rope_scaling"]["factor"] == 4.0


# ---------------------------------------------------------------- Qwen3-MoE

@pytest.fixture(scope="module")
def moe_files(tmp_path_factory):
    from tinymodel import make_tiny, write_gguf
    root = tmp_path_factory.mktemp("moe")
    model_dir = make_tiny(root / "hf", seed=6, arch="qwen3_moe")
    return model_dir, write_gguf(model_dir, root / "f32.gguf", "F32"), write_gguf(model_dir, root / "q8.gguf", "Q8_0")


IDS = [5, 77, 200, 12, 199, 42, 260, 3, 150, 9, 31, 64]


def test_qwen3moe_gguf_computes_what_the_directory_computes(moe_files):
    """llama.cpp's qwen3moe layout (a router per layer, each kind of expert matrix stacked in one
    3-D tensor) reads as the directory's per-expert matrices (which test_parity.py holds to
    transformers): the same logits, bit for bit, from the same float32 weights."""
    import qwenc
    model_dir, f32, _ = moe_files
    config, hf = gguf_to_hf(open_gguf(f32))
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == 8
    assert config["num_experts_per_tok"] == 2 and config["moe_intermediate_size"] == 64
    assert hf["model.layers.0.mlp.experts.gate_proj.weight"].shape == (8, 64, 64)
    assert hf["model.layers.1.mlp.gate.weight"].shape == (8, 64)
    ours = qwenc.load(f32)
    assert ours.config.moe_layers == (0, 1)
    np.testing.assert_array_equal(ours.logits(IDS, all_positions=True),
                                  qwenc.load(model_dir).logits(IDS, all_positions=True))


@pytest.mark.parametrize("activations", ["int16", "int8"])
def test_qwen3moe_integer_modes_repack_the_experts_and_batch_invariantly(moe_files, activations):
    """Quantized experts go through the integer kernels (each expert repacked like any matrix),
    and a row's logits are the same bits whether it is decoded alone or beside others (whose
    tokens pick other experts)."""
    import qwenc
    _, _, q8 = moe_files
    model = qwenc.load(q8, activations=activations, context=64)
    experts = [lin for layer in model.weights.layers for e in layer.experts for lin in e]
    assert len(experts) == 2 * 8 * 3 and all(lin.packed is not None for lin in experts)
    exact = qwenc.load(q8, activations="f32").logits(IDS, all_positions=True)
    assert np.abs(model.logits(IDS, all_positions=True) - exact).max() < (0.05 if activations == "int16" else 0.5)
    prompts = [IDS[:4], IDS[2:11], [7, 8, 9, 100, 101], IDS[::-1]]
    seqs = [model.new_sequence() for _ in prompts]
    for s, p in zip(seqs, prompts):
        model.forward(s, p[:-1])
    for row, p in zip(model.decode_batch(seqs, [p[-1] for p in prompts]), prompts):
        np.testing.assert_array_equal(row, model.logits(p))


def test_qwen3moe_fused_expert_tensors(moe_files, tmp_path):
    """transformers' in-memory layout saved as is (experts.gate_up_proj [experts, 2 x rows,
    cols], experts.down_proj [experts, cols, rows]) reads as the per-expert one."""
    import shutil
    import qwenc
    from safetensors.numpy import load_file, save_file
    model_dir = moe_files[0]
    fused = tmp_path / "fused"
    shutil.copytree(model_dir, fused)
    tensors = load_file(str(fused / "model.safetensors"))
    out = {k: v for k, v in tensors.items() if ".experts." not in k}
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = np.stack([np.concatenate([tensors[f"{p}{e}.gate_proj.weight"],
                                                            tensors[f"{p}{e}.up_proj.weight"]]) for e in range(8)])
        out[p + "down_proj"] = np.stack([tensors[f"{p}{e}.down_proj.weight"] for e in range(8)])
    save_file(out, str(fused / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_array_equal(qwenc.load(fused).logits(IDS, all_positions=True),
                                  qwenc.load(model_dir).logits(IDS, all_positions=True))
    out["model.layers.1.mlp.experts.down_proj"] = out["model.layers.1.mlp.experts.down_proj"][:7]
    save_file(out, str(fused / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(qwenc.WeightError, match="down_proj"):
        qwenc.load(fused)


def test_qwen3moe_engine_batched_equals_alone(moe_files):
    """The serving engine on a MoE model: mixed prefill and decode steps of several requests give
    each the tokens it gets alone (greedy), in the default integer mode on quantized experts."""
    import qwenc
    from qwenc.engine.engine import Engine
    model = qwenc.load(moe_files[2], context=256)
    prompts = ["hello there", "the hell", "tell the hell", "he he he", "a b c d e f g"]
    want = [list(model.generate_tokens(model.tokenizer.encode(p), max_tokens=10, temperature=0,
                                       stop_token_ids=[])) for p in prompts]
    with Engine(model, max_batch=4, kv_memory="8MiB", max_step_tokens=5) as engine:
        got = engine.generate(prompts, max_tokens=10, temperature=0, ignore_eos=True)
    assert [c.token_ids for c in got] == want


def test_qwen2moe_gguf_computes_what_the_directory_computes(tmp_path):
    """llama.cpp's qwen2moe layout (the experts stacked, the shared expert's gate a vector, the
    picked experts' weights not renormalised) reads as the directory's Qwen2-MoE; in int16 its
    batched rows equal each row alone."""
    import qwenc
    from tinymodel import make_tiny, write_gguf
    model_dir = make_tiny(tmp_path / "hf", seed=8, arch="qwen2_moe")
    path = write_gguf(model_dir, tmp_path / "f32.gguf", "F32")
    gf = open_gguf(path)
    config, hf = gguf_to_hf(gf)
    assert config["architectures"] == ["Qwen2MoeForCausalLM"] and not config["norm_topk_prob"]
    assert config["shared_expert_intermediate_size"] == 96 and config["qkv_bias"]
    # the file holds the gate as a vector; the HF view has transformers' [1, hidden]
    assert gf.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (64,)
    assert hf["model.layers.0.mlp.shared_expert_gate.weight"].shape == (1, 64)
    np.testing.assert_array_equal(qwenc.load(path).logits(IDS, all_positions=True),
                                  qwenc.load(model_dir).logits(IDS, all_positions=True))
    model = qwenc.load(write_gguf(model_dir, tmp_path / "q8.gguf", "Q8_0"), context=64)
    assert model.activations == "int16"
    prompts = [IDS[:4], IDS[2:11], IDS[::-1]]
    seqs = [model.new_sequence() for _ in prompts]
    for s, p in zip(seqs, prompts):
        model.forward(s, p[:-1])
    for row, p in zip(model.decode_batch(seqs, [p[-1] for p in prompts]), prompts):
        np.testing.assert_array_equal(row, model.logits(p))
