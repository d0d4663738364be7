"""Peak resident memory of the default mode on the real demo GGUF: after loading, a 4,096-token
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
def test_real_model_peak_rss_within_file_kv_and_100_mib(demo_gguf):
    got = bench_memory.peak(bench_memory.QWENC, str(demo_gguf), 2)
    assert got["kv_dtype"] == "f16"
    file_bytes = Path(demo_gguf).stat().st_size
    bound = file_bytes + got["kv"] + 100 * 2**20
    print(f"peak RSS {got['hwm'] / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB "
          f"(file {file_bytes / 2**20:.0f} + KV {got['kv'] / 2**20:.0f} + 100)")
    assert got["hwm"] <= bound, (got["hwm"] / 2**20, bound / 2**20)
