"""The expert step (csrc/moe.c) on its own, on every SIMD path the CPU has and the plain one: the router's picks against numpy's stable sort, a layer
of experts against a float64 numpy reference, a row's bits whatever rows share its step, and bad
arguments refused. (The whole models are held to transformers by test_parity.py.)"""
import numpy as np
import pytest

from qwenc import _ops
from qwenc.model.forward import aligned_bytes

F32 = 0


def ref_route(logits, k, norm):
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, axis=1)
    if norm:
        w /= w.sum(axis=1, keepdims=True)
    return top, w


@pytest.mark.parametrize("E,k", [(8, 1), (8, 2), (60, 4), (128, 8), (5, 5), (7, 3)])
@pytest.mark.parametrize("norm", [False, True])
def test_route_picks_numpys_stable_top_k(E, k, norm):
    rng = np.random.default_rng(E * 10 + k)
    logits = rng.standard_normal((33, E)).astype(np.float32) * 3
    logits[::4, 1::3] = logits[::4, :1]  # ties: the lower expert goes first
    logits[5] = 0.25                     # a row of ties alone
    want_top, want_w = ref_route(logits, k, norm)
    top, w = _ops.moe_route(logits.copy(), k, norm)
    np.testing.assert_array_equal(top, want_top)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-7)
    if norm:
        np.testing.assert_allclose(w.sum(axis=1), 1, rtol=1e-6)


def test_route_nan_rows_still_pick_distinct_experts():
    logits = np.zeros((2, 6), np.float32)
    logits[0, 2] = np.nan
    top, w = _ops.moe_route(logits, 4, True)
    for row in top:
        assert len(set(row.tolist())) == 4 and row.min() >= 0 and row.max() < 6


def f32(a):
    a = np.ascontiguousarray(a, np.float32)
    return (a.view(np.uint8).reshape(-1), F32, a.shape[0], None, None)


def make_layer(rng, D=48, E=6, k=2, I=40, shared_I=0, norm=True):
    g = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    w = dict(router=g(E, D), experts=[(g(I, D), g(I, D), g(D, I)) for _ in range(E)], shape=(D, E, k, I, shared_I))
    if shared_I:
        w["shared"] = (g(shared_I, D), g(shared_I, D), g(D, shared_I))
        w["shared_gate"] = g(1, D)
    ex = _ops.Experts(D, k, norm, f32(w["router"]), [tuple(map(f32, e)) for e in w["experts"]],
                      tuple(map(f32, w["shared"])) if shared_I else None,
                      f32(w["shared_gate"]) if shared_I else None)
    return ex, w


def ref_layer(w, h, k, norm):
    silu = lambda x: x / (1 + np.exp(-x))
    mlp = lambda m, x: (silu(x @ m[0].T.astype(np.float64)) * (x @ m[1].T.astype(np.float64))) @ m[2].T
    x = h.astype(np.float64)
    top, wt = ref_route((x @ w["router"].T.astype(np.float64)).astype(np.float32), k, norm)
    out = np.zeros_like(x)
    for t in range(len(x)):
        for e, we in zip(top[t], wt[t]):
            out[t] += we * mlp(w["experts"][e], x[t:t + 1])[0]
    if "shared" in w:
        s = x @ w["shared_gate"].T.astype(np.float64)
        out += 1 / (1 + np.exp(-s)) * mlp(w["shared"], x)
    return out


def scratch(w, T):
    return aligned_bytes(_ops.moe_scratch_bytes(*w["shape"], T))


@pytest.mark.parametrize("k,shared_I,norm", [(2, 0, True), (3, 0, False), (1, 0, True), (2, 56, False), (6, 24, True)])
def test_layer_of_experts_matches_numpy(k, shared_I, norm, simd):
    rng = np.random.default_rng(k + shared_I)
    ex, w = make_layer(rng, k=k, shared_I=shared_I, norm=norm)
    h = rng.standard_normal((13, 48)).astype(np.float32)
    out = np.empty_like(h)
    _ops.moe_mlp(ex, h, out, scratch(w, 13), 0)
    np.testing.assert_allclose(out, ref_layer(w, h, k, norm), rtol=1e-5, atol=1e-5)


def test_falsifier_wrong_routing_is_seen():
    rng = np.random.default_rng(3)
    ex, w = make_layer(rng, k=2, norm=True)
    wrong, _ = make_layer(np.random.default_rng(3), k=2, norm=False)
    h = rng.standard_normal((13, 48)).astype(np.float32)
    out = np.empty_like(h)
    _ops.moe_mlp(wrong, h, out, scratch(w, 13), 0)
    assert np.abs(out - ref_layer(w, h, 2, True)).max() > 1e-3


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_its_step(threads, simd):
    """Every row of a step (the per-expert path) equals that row alone (the lone-row path)."""
    rng = np.random.default_rng(9)
    ex, w = make_layer(rng, k=3, shared_I=24)
    h = rng.standard_normal((21, 48)).astype(np.float32)
    old = _ops.get_threads()
    _ops.set_threads(threads)
    try:
        out = np.empty_like(h)
        _ops.moe_mlp(ex, h, out, scratch(w, 21), 0)
        for t in range(21):
            one = np.empty((1, 48), np.float32)
            _ops.moe_mlp(ex, h[t:t + 1].copy(), one, scratch(w, 1), 0)
            np.testing.assert_array_equal(one[0], out[t])
        part = np.empty((5, 48), np.float32)
        _ops.moe_mlp(ex, h[7:12].copy(), part, scratch(w, 5), 0)
        np.testing.assert_array_equal(part, out[7:12])
    finally:
        _ops.set_threads(old)


def test_more_picks_than_the_lone_row_path_sorts():
    """A row picking more than 64 experts takes the per-expert path even alone: still the
    reference's result, and each row's bits whatever its step."""
    rng = np.random.default_rng(4)
    ex, w = make_layer(rng, D=32, E=70, k=66, I=8, norm=True)
    h = rng.standard_normal((3, 32)).astype(np.float32)
    out = np.empty_like(h)
    _ops.moe_mlp(ex, h, out, scratch(w, 3), 0)
    np.testing.assert_allclose(out, ref_layer(w, h, 66, True), rtol=1e-5, atol=1e-5)
    one = np.empty((1, 32), np.float32)
    _ops.moe_mlp(ex, h[1:2].copy(), one, scratch(w, 1), 0)
    np.testing.assert_array_equal(one[0], out[1])


def test_bad_arguments_are_refused():
    rng = np.random.default_rng(1)
    ex, w = make_layer(rng)
    h = np.ones((4, 48), np.float32)
    out = np.empty_like(h)
    s = scratch(w, 4)
    with pytest.raises(ValueError, match="needs"):
        _ops.moe_mlp(ex, h, out, s[:-1], 0)
    raw = np.empty(len(s) + 128, np.uint8)
    at = -raw.ctypes.data % 64 + 8
    with pytest.raises(ValueError, match="aligned"):
        _ops.moe_mlp(ex, h, out, raw[at:at + len(s)], 0)
    with pytest.raises(ValueError, match="alias"):
        _ops.moe_mlp(ex, h, h, s, 0)
    with pytest.raises(ValueError):
        _ops.moe_mlp(ex, np.ones((4, 32), np.float32), np.empty((4, 32), np.float32), s, 0)
    with pytest.raises(ValueError, match="out of"):
        _ops.Experts(48, 7, True, f32(w["router"]), [tuple(map(f32, e)) for e in w["experts"]])
    with pytest.raises(ValueError, match="rows"):  # a router for 5 experts over 6
        _ops.Experts(48, 2, True, f32(w["router"][:5]), [tuple(map(f32, e)) for e in w["experts"]])
    with pytest.raises(ValueError, match="rows"):  # an expert of another width
        bad = [tuple(map(f32, e)) for e in w["experts"]]
        bad[3] = (f32(w["experts"][3][0][:32]),) + bad[3][1:]
        _ops.Experts(48, 2, True, f32(w["router"]), bad)
    with pytest.raises(ValueError, match="too small"):
        short = f32(w["router"])
        _ops.Experts(48, 2, True, (short[0][:-4],) + short[1:], [tuple(map(f32, e)) for e in w["experts"]])
