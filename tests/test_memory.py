"""Peak resident memory of the default mode on both real demo GGUFs (0.5B and 1.5B): after loading, a 4,096-token
prompt of scattered tokens and a few decode steps, the process's high-water mark (VmHWM, the
kernel's own count) stays within the weight file + the KV cache + 100 MiB, the bound README.md
states. Scattered tokens are the hard case for the embedding lookup (each row read from the
mapped table maps its neighbours in too), and the load is where a large matrix's stored and
repacked copies could both be resident. The run is bench/bench_memory.py's, in a fresh
interpreter, so nothing else the suite holds is counted."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_memory  # noqa: E402


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("which", ["demo_gguf", "demo_1p5b_gguf"])
def test_real_model_peak_rss_within_file_kv_and_100_mib(which, request):
    demo_gguf = request.getfixturevalue(which)
    got = bench_memory.peak(bench_memory.QWENC, str(demo_gguf), 2)
    assert got["kv_dtype"] == "f16"
    file_bytes = Path(demo_gguf).stat().st_size
    bound = file_bytes + got["kv"] + 100 * 2**20
    print(f"peak RSS {got['hwm'] / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB "
          f"(file {file_bytes / 2**20:.0f} + KV {got['kv'] / 2**20:.0f} + 100)")
    assert got["hwm"] <= bound, (got["hwm"] / 2**20, bound / 2**20)


def test_embedding_lookup_in_slices_gives_the_same_logits(demo_gguf, monkeypatch):
    """A long step looks its tokens up EMBED_RELEASE_ROWS at a time, releasing the table's pages
    after each slice; the logits are those of one lookup of all the rows (odd lengths: a last
    slice that is partial)."""
    import numpy as np

    import qwenc
    from qwenc.model import forward

    m = qwenc.load(str(demo_gguf), context=256)
    assert m.transformer.weights.embed_lookup_only()
    ids = np.random.default_rng(1).integers(0, 150000, 150).tolist()

    def logits():
        seq = m.new_sequence(256)
        return m.forward(seq, ids, all_positions=True)

    sliced = logits()
    monkeypatch.setattr(forward, "EMBED_RELEASE_ROWS", 10**9)
    whole = logits()
    np.testing.assert_array_equal(sliced, whole)
    monkeypatch.setattr(forward, "EMBED_RELEASE_ROWS", 7)
    np.testing.assert_array_equal(logits(), whole)
