"""The roofline module: intensities, roofs, layer products, traffic, training time."""

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mha_lit import counting, models, plots, roofline  # noqa: E402

GPT2, GPT3 = models.PRESETS["gpt2-small"], models.PRESETS["gpt3-175b"]


def test_intensity_of_the_book_shapes_and_its_small_m_limit():
    # (3 x 5) @ (5 x 7) in float64: 2*105 FLOPs over 8 * (15 + 35 + 21) bytes
    assert roofline.matmul_intensity(3, 5, 7, 8) == 210 / (8 * 71)
    # one row against a large square matrix: 2 k n / (b (k + k n + n)) -> 2 / b
    assert abs(roofline.matmul_intensity(1, 4096, 4096, 4) - 0.5) < 1e-3
    with pytest.raises(ValueError, match="bytes_per_value"):
        roofline.matmul_intensity(1, 2, 3, 0)
    with pytest.raises(TypeError, match="b must be a positive integer"):
        roofline.matmul_intensity(1, 2.0, 3, 4)


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096))
def test_intensity_grows_with_every_size(m, k, n):
    base = roofline.matmul_intensity(m, k, n, 2)
    assert roofline.matmul_intensity(m + 1, k, n, 2) > base
    assert roofline.matmul_intensity(m, k, n + 1, 2) > base
    assert roofline.matmul_intensity(m, k + 1, n, 2) > base
    # never more than the wide limit 2 a / s, for a the fewest rows (s = 2 bytes)
    assert base <= 2 * min(m, k, n) / 2


def test_roof_is_bandwidth_then_peak():
    y = roofline.attainable_flops(np.array([1.0, 10.0, 100.0]), 1000.0, 20.0)
    assert np.array_equal(y, [20.0, 200.0, 1000.0])
    assert roofline.roofline_seconds(100.0, 10.0, 50.0, 1.0) == 10.0  # memory-bound
    assert roofline.roofline_seconds(100.0, 1.0, 50.0, 10.0) == 2.0  # compute-bound


def test_accelerator_table_is_the_datasheets_dense_figures():
    a = roofline.ACCELERATORS
    assert a["H100"].peak_flops == 989e12 and a["H100"].bandwidth == 3.35e12
    assert a["H200"].peak_flops == a["H100"].peak_flops and a["H200"].bandwidth == 4.8e12
    assert a["A100"].peak_flops == 312e12 and a["A100"].bandwidth == 2039e9
    assert a["V100"].peak_flops == 125e12 and a["V100"].precision == "fp16"
    assert abs(a["H100"].ridge_point - 295.2) < 0.1
    bib = open("book/references.bib").read()
    for acc in a.values():
        assert "{" + acc.source + "," in bib, acc.source


def test_layer_products_count_the_layer_and_the_cache():
    prefill = roofline.layer_products(GPT2, 1024, 1024, bytes_per_value=4)
    flops = sum(p.flops for p in prefill)
    bd = counting.flops_breakdown(GPT2, 1024)
    assert flops * GPT2.layers == sum(v for k, v in bd.items() if k != "output layer")
    # one decoding step: weight bytes once, plus every head's cache, plus small vectors
    step = roofline.layer_products(GPT3, 1, 2048, batch=1, bytes_per_value=2)
    weights = 2 * (12 * GPT3.d_model**2)
    cache = counting.kv_cache_bytes(GPT3, 2048) / GPT3.layers
    total = sum(p.bytes for p in step)
    assert weights + cache < total < 1.01 * (weights + cache)
    # batching shares the weights, not the cache
    step8 = roofline.layer_products(GPT3, 1, 2048, batch=8, bytes_per_value=2)
    by = {p.name: p for p in step8}
    assert by["X W_1"].bytes < 1.01 * {p.name: p for p in step}["X W_1"].bytes
    assert by["Q K^T"].bytes == 8 * {p.name: p for p in step}["Q K^T"].bytes
    with pytest.raises(ValueError, match="exceeds context"):
        roofline.layer_products(GPT2, 5, 4)


def test_compute_bound_batch_is_the_first_batch_past_the_ridge():
    for acc in roofline.ACCELERATORS.values():
        for cfg in (GPT2, GPT3):
            B = roofline.compute_bound_batch(cfg, acc)
            d = cfg.d_model
            assert roofline.matmul_intensity(B, d, d, 2) >= acc.ridge_point
            assert roofline.matmul_intensity(B - 1, d, d, 2) < acc.ridge_point
    tiny = models.TransformerConfig(1, 64, 4, 256, 13, 16)  # limit 64 FLOPs/byte
    with pytest.raises(ValueError, match="never reaches"):
        roofline.compute_bound_batch(tiny, roofline.ACCELERATORS["H100"])


def test_attention_traffic_follows_dao_et_al():
    n, d = 2048, 128
    assert roofline.attention_traffic(n, d) == 4 * n * d + 4 * n * n
    M = 100_000
    tiled = roofline.attention_traffic(n, d, M)
    Bc = math.ceil(M / (4 * d))
    assert tiled == n * d + 2 * n + 2 * n * d + math.ceil(n / Bc) * (3 * n * d + 4 * n)
    # Theta(n^2 d^2 / M): doubling n nearly quadruples the tiled traffic
    assert 3.5 < roofline.attention_traffic(2 * n, d, M) / tiled < 4.1
    # more on-chip memory, less traffic; the standard count does not depend on it
    assert roofline.attention_traffic(n, d, 4 * M) < tiled
    # for long sequences the ratio of the two counts tends to M / (3 d^2)
    long = 2**22
    ratio = roofline.attention_traffic(long, d) / roofline.attention_traffic(long, d, M)
    assert abs(ratio / (M / (3 * d * d)) - 1) < 0.05
    with pytest.raises(ValueError, match="cannot hold"):
        roofline.attention_traffic(n, d, 100)


def test_flashattention2_traffic_reads_keys_and_values_once_per_query_block():
    """Dao (2023), Algorithm 1: Q read and O written once, L written once, K and V read
    T_r = ceil(n / B_r) times, with B_r = ceil(M / 4 d_k) here."""
    for n, d_k, M in ((2048, 128, 116_736), (1024, 64, 100_000), (300, 16, 64), (7, 5, 20)):
        Br = math.ceil(M / (4 * d_k))
        fa2 = roofline.attention_traffic_fa2(n, d_k, M)
        assert fa2 == 2 * n * d_k + n + math.ceil(n / Br) * 2 * n * d_k
        # one query block (B_r >= n): every input once, the output once
        if Br >= n:
            assert fa2 == 4 * n * d_k + n
    # the same on-chip memory: the repeated traffic is 2 n d_k per block, not 3 n d_k + 4 n,
    # so the loop swap moves less, and the ratio to the standard count tends to M / (2 d_k^2)
    n, d_k, M = 2048, 128, 116_736
    assert roofline.attention_traffic_fa2(n, d_k, M) < roofline.attention_traffic(n, d_k, M)
    long = 2**22
    ratio = roofline.attention_traffic(long, d_k) / roofline.attention_traffic_fa2(long, d_k, M)
    assert abs(ratio / (M / (2 * d_k * d_k)) - 1) < 0.05
    assert 3.5 < roofline.attention_traffic_fa2(2 * n, d_k, M) / roofline.attention_traffic_fa2(
        n, d_k, M) < 4.1
    with pytest.raises(ValueError, match="cannot hold"):
        roofline.attention_traffic_fa2(n, d_k, 4 * d_k - 1)
    with pytest.raises(TypeError, match="d_k must be a positive integer"):
        roofline.attention_traffic_fa2(n, 1.5, M)


@pytest.mark.parametrize("b, c", [(12288, 12288), (12288, 49152), (768, 2304), (1031, 997)])
def test_rows_at_ridge_is_the_first_row_count_past_the_ridge(b, c):
    for acc in roofline.ACCELERATORS.values():
        a = roofline.rows_at_ridge(b, c, acc)
        assert roofline.matmul_intensity(a, b, c, 2) >= acc.ridge_point
        assert a == 1 or roofline.matmul_intensity(a - 1, b, c, 2) < acc.ridge_point
        # never fewer than the wide limit's s I* / 2 rows
        assert a >= acc.ridge_point - 1e-9
    h100 = roofline.ACCELERATORS["H100"]
    # a wider matrix reaches the ridge with fewer rows; W_O is the last of GPT-3's
    assert roofline.rows_at_ridge(12288, 49152, h100) < roofline.rows_at_ridge(12288, 12288, h100)
    assert roofline.rows_at_ridge(12288, 12288, h100) == roofline.compute_bound_batch(GPT3, h100)
    with pytest.raises(ValueError, match="never reaches"):
        roofline.rows_at_ridge(64, 64, h100)


def test_training_compute_of_gpt3():
    C = roofline.training_flops(counting.param_count(GPT3), 300e9)
    assert abs(C / 3.14e23 - 1) < 0.01  # Brown et al. 2020, Table D.1
    days = roofline.training_days(C, roofline.ACCELERATORS["H100"], 1024, 0.5)
    assert days == pytest.approx(C / (1024 * 989e12 * 0.5) / 86400)
    with pytest.raises(ValueError, match="mfu"):
        roofline.training_days(C, roofline.ACCELERATORS["H100"], 1, 1.5)


def test_measure_rates_returns_positive_rates_of_each_kind():
    rates = roofline.measure_rates(size=64, stream_bytes=2**20, repeats=1)
    assert set(rates) == {"matmul", "matvec", "bandwidth", "copy"}
    assert all(np.isfinite(v) and v > 0 for v in rates.values())
    # the matrix-vector product does one multiply-add per 4-byte number read
    assert rates["matvec"] / rates["bandwidth"] == pytest.approx(0.5)


def test_roofline_plot_puts_points_on_their_roof():
    fig = plots.roofline({"cpu": (100.0, 10.0), "gpu": (1000.0, 5.0)},
                         {"decode": (0.5, "cpu"), "prefill": (800.0, "gpu")}, title="t")
    ax = fig.axes[0]
    lines = {ln.get_gid(): ln for ln in ax.lines if ln.get_gid()}
    assert set(lines) == {"roof:cpu", "roof:gpu", "point:decode", "point:prefill"}
    assert lines["point:decode"].get_ydata()[0] == 5.0  # 0.5 * 10, memory-bound
    assert lines["point:prefill"].get_ydata()[0] == 1000.0  # at the peak
    roof = lines["roof:gpu"]
    assert np.max(roof.get_ydata()) == 1000.0
    assert ax.get_xscale() == "log" and ax.get_title() == "t"
    with pytest.raises(ValueError, match="not one of"):
        plots.roofline({"cpu": (1.0, 1.0)}, {"p": (1.0, "tpu")})
    with pytest.raises(ValueError, match="positive peak"):
        plots.roofline({"cpu": (0.0, 1.0)})


def test_gpt_only_counts_refuse_other_blocks():
    """layer_products and compute_bound_batch count a GPT block; a Llama-style
    DecoderConfig (grouped heads, SwiGLU) is refused, not silently miscounted."""
    from mha_lit.models import MODELS

    cfg = MODELS["llama2-70b"].config  # 64 query heads, 8 key/value heads
    with pytest.raises(TypeError, match="layer_products needs a TransformerConfig"):
        roofline.layer_products(cfg, 1, 16)
    with pytest.raises(TypeError, match="compute_bound_batch needs a TransformerConfig"):
        roofline.compute_bound_batch(cfg, roofline.ACCELERATORS["H100"])


# --- mutation-test gaps (shared/reviews/mutation.md): datasheets, measure_rates, the roofs ----

KiB, MiB = 2**10, 2**20
# Every field of ACCELERATORS, as published (roofline-37, -90, -109, -168, -178). Rates, HBM
# bandwidth and capacity: the datasheets the entries cite (nvidia2017v100, nvidia2020a100,
# nvidia2022h100, nvidia2024h200 in book/references.bib); dense 16-bit tensor-core rates.
# On-chip sizes (L2, shared memory per SM, register file per SM, SM count): the architecture
# whitepapers, Volta (V100: 6 MB L2, up to 96 KB shared memory per SM, 80 SMs), Ampere (A100:
# 40 MB L2, up to 164 KB, 108 SMs) and Hopper (nvidia2022hopper; H100 SXM5: 50 MB L2, up to
# 228 KB, 132 SMs); H200 is the same GH100 chip with more HBM. Every SM: 65,536 32-bit
# registers = 256 KiB. On-chip capacities are binary (a datasheet's "50 MB" of L2 is 50 MiB).
DATASHEETS = {
    "V100": dict(name="NVIDIA V100 SXM2 32 GB", peak_flops=125e12, precision="fp16",
                 bandwidth=900e9, memory=32e9, l2=6 * MiB, sram_per_sm=96 * KiB,
                 registers_per_sm=256 * KiB, sms=80, source="nvidia2017v100"),
    "A100": dict(name="NVIDIA A100 SXM4 80 GB", peak_flops=312e12, precision="bf16",
                 bandwidth=2039e9, memory=80e9, l2=40 * MiB, sram_per_sm=164 * KiB,
                 registers_per_sm=256 * KiB, sms=108, source="nvidia2020a100"),
    "H100": dict(name="NVIDIA H100 SXM5 80 GB", peak_flops=989e12, precision="bf16",
                 bandwidth=3.35e12, memory=80e9, l2=50 * MiB, sram_per_sm=228 * KiB,
                 registers_per_sm=256 * KiB, sms=132, source="nvidia2022h100"),
    "H200": dict(name="NVIDIA H200 SXM 141 GB", peak_flops=989e12, precision="bf16",
                 bandwidth=4.8e12, memory=141e9, l2=50 * MiB, sram_per_sm=228 * KiB,
                 registers_per_sm=256 * KiB, sms=132, source="nvidia2024h200"),
}


@pytest.mark.parametrize("key", sorted(DATASHEETS))
def test_every_accelerator_field_is_its_datasheets(key):
    acc = roofline.ACCELERATORS[key]
    for field, value in DATASHEETS[key].items():
        assert getattr(acc, field) == value, (key, field)
    assert set(roofline.ACCELERATORS) == set(DATASHEETS)
    # and the hierarchy the chapter draws: registers and shared memory of one SM < L2 < HBM
    assert acc.sram_per_sm < acc.l2 < acc.memory and acc.registers_per_sm < acc.l2


def test_h200_is_an_h100_with_more_and_faster_memory():
    h100, h200 = roofline.ACCELERATORS["H100"], roofline.ACCELERATORS["H200"]
    for field in ("peak_flops", "precision", "l2", "sram_per_sm", "registers_per_sm", "sms"):
        assert getattr(h200, field) == getattr(h100, field), field
    assert h200.memory > h100.memory and h200.bandwidth > h100.bandwidth


class _Clock:
    """A fake time.perf_counter: the k-th timed run takes durations[k] seconds."""

    def __init__(self, durations):
        self.ticks, now = [], 0.0
        for d in durations:
            self.ticks += [now, now + d]
            now += d + 1000.0
        self.ticks.reverse()

    def perf_counter(self):
        return self.ticks.pop()


@pytest.mark.parametrize("dtype, stream_bytes", [(np.float32, 2**15), (np.float64, 2**16)])
def test_measure_rates_formulas_with_a_fake_clock(monkeypatch, dtype, stream_bytes):
    """The rates are 2 size^3 / t_matmul, 2 M.size / t_matvec, M.nbytes / t_matvec and
    2 M.nbytes / t_copy (read + write), each t the best of `repeats` runs (roofline-234).
    A fake clock makes them exact: runs in the docstring's order, matmul, matvec, copy."""
    size = 8
    clock = _Clock([2.0, 3.0, 5.0, 4.0, 0.25, 0.5])  # repeats=2: best 2.0, 4.0 and 0.25
    monkeypatch.setattr(roofline, "time", clock)
    rates = roofline.measure_rates(dtype, size=size, stream_bytes=stream_bytes, repeats=2)
    assert not clock.ticks  # exactly two timed runs of each
    itemsize = np.dtype(dtype).itemsize  # the matrix holds stream_bytes bytes (1024 columns)
    assert rates == {"matmul": 2 * size**3 / 2.0,
                     "matvec": 2 * (stream_bytes // itemsize) / 4.0,
                     "bandwidth": stream_bytes / 4.0,
                     "copy": 2 * stream_bytes / 0.25}


def test_roofline_plot_draws_each_roof_as_min_of_peak_and_intensity_times_bandwidth():
    """Each roof line's y is min(peak, x * bandwidth) at its x (plots.part2-161), bound by
    memory below the ridge peak / bandwidth and flat at the peak above it."""
    ceilings = {"cpu": (100.0, 10.0), "gpu": (1000.0, 5.0), "h100": (989e12, 3.35e12)}
    fig = plots.roofline(ceilings)
    ax = fig.axes[0]
    lines = {ln.get_gid(): ln for ln in ax.lines if ln.get_gid()}
    for label, (peak, bw) in ceilings.items():
        x, y = (np.asarray(a) for a in lines[f"roof:{label}"].get_data())
        assert np.array_equal(y, np.minimum(peak, x * bw)), label
        ridge = peak / bw
        assert x.min() < ridge < x.max()
        assert np.array_equal(y[x < ridge], x[x < ridge] * bw) and np.all(y[x >= ridge] == peak)
        assert f"{label}: ridge at {ridge:,.1f} FLOPs/byte" in [t.get_text() for t in ax.get_legend().get_texts()]
    # the ridge marks sit at (peak / bandwidth, peak)
    marks = {(float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in ax.lines if ln.get_marker() == "|"}
    assert marks == {(peak / bw, peak) for peak, bw in ceilings.values()}
    import matplotlib.pyplot as plt

    plt.close(fig)


# --- chapter 20: the backward pass's traffic -------------------------------------------------

def _tally_backward(n, d, M, version, read_output=False):
    """Walk the loops of Dao et al. (2022) Algorithm 4 or Dao (2023) Algorithm 2, block by
    block, adding up the numbers each line moves between HBM and the chip."""
    Bc = math.ceil(M / (4 * d))
    Br = min(Bc, d)  # the query blocks' size does not change the totals
    moved = 3 * n * d if version == 1 else n * d + 2 * n * d + n  # zeros; FA-2: Delta
    for c0 in range(0, n, Bc):
        moved += 2 * d * (min(c0 + Bc, n) - c0)  # K_j, V_j
        for r0 in range(0, n, Br):
            rows = min(r0 + Br, n) - r0
            # Q, (O,) dO, dQ (FA-2 lists dQ_i on lines 9 and 15: read once); 2 stats
            per_row = (4 if version == 1 or read_output else 3) * d + 2
            moved += rows * (per_row + d)  # ... and dQ_i written back
        moved += 2 * d * (min(c0 + Bc, n) - c0)  # dK_j, dV_j written
    return moved


@pytest.mark.parametrize("n, d, M", [(2048, 128, 116_736), (1024, 64, 100_000), (300, 16, 64),
                                     (7, 5, 20), (1031, 97, 3 * 97 * 4 + 1)])
def test_backward_traffic_is_the_algorithms_tally(n, d, M):
    assert roofline.backward_traffic(n, d, M) == _tally_backward(n, d, M, 1)
    assert roofline.backward_traffic_fa2(n, d, M) == _tally_backward(n, d, M, 2)
    assert roofline.backward_traffic_fa2(n, d, M, read_output=True) == _tally_backward(
        n, d, M, 2, read_output=True)


def test_standard_backward_moves_five_n_by_n_matrices_seven_times():
    """Algorithm 3: S read twice, dS written and read, dZ written and read twice: 7 n^2;
    dH twice, V, K, Q read and dV, dQ, dK written: 8 n d."""
    for n, d in ((1, 1), (3, 7), (1024, 64), (2048, 128)):
        assert roofline.backward_traffic(n, d) == 8 * n * d + 7 * n * n
    # forward and backward of the standard computation: 12 n d + 11 n^2
    assert roofline.attention_traffic(5, 3) + roofline.backward_traffic(5, 3) == 12 * 15 + 11 * 25


def test_tiled_backward_traffic_grows_as_n_squared_d_squared_over_m():
    n, d, M = 2048, 128, 116_736
    fa1, fa2 = roofline.backward_traffic(n, d, M), roofline.backward_traffic_fa2(n, d, M)
    # with line 9's output block, and dQ_i once (lines 9 and 15 both list it), Algorithm 2
    # moves what Algorithm 4 does, and Delta once: n more
    assert fa2 < roofline.backward_traffic_fa2(n, d, M, read_output=True) == fa1 + n
    assert fa1 < roofline.backward_traffic(n, d)
    assert 3.5 < roofline.backward_traffic(2 * n, d, M) / fa1 < 4.1
    assert roofline.backward_traffic(n, d, 4 * M) < fa1
    long = 2**22
    plain = roofline.backward_traffic(long, d)
    assert abs(plain / roofline.backward_traffic(long, d, M) / (7 * M / (20 * d * d)) - 1) < 0.05
    assert abs(plain / roofline.backward_traffic_fa2(long, d, M) / (7 * M / (16 * d * d)) - 1
               ) < 0.05
    # the exact limits: 5 d + 2 (4 d + 2) numbers per query row and key block of B_c keys
    b_c = -(-M // (4 * d))
    assert abs(plain / roofline.backward_traffic(long, d, M) / (7 * b_c / (5 * d + 2)) - 1) < 1e-3
    assert abs(plain / roofline.backward_traffic_fa2(long, d, M) / (7 * b_c / (4 * d + 2)) - 1
               ) < 1e-3
    # one key block (B_c >= n): every array crosses once or twice, nothing n x n
    assert roofline.backward_traffic_fa2(10, 4, 4 * 4 * 10) == 7 * 40 + 10 + 4 * 40 + 20
    with pytest.raises(ValueError, match="cannot hold"):
        roofline.backward_traffic(n, d, 4 * d - 1)
    with pytest.raises(ValueError, match="cannot hold"):
        roofline.backward_traffic_fa2(n, d, 100)
    with pytest.raises(TypeError, match="sram_values must be a positive integer"):
        roofline.backward_traffic_fa2(n, d, 1e6)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        roofline.backward_traffic(0, d)


def test_traffic_curves_one_colour_per_label_dashed_forward():
    import matplotlib.pyplot as plt
    from test_plots import SMALLEST_TEXT_PT, _text_below
    n = np.array([128, 256, 512])
    panels = {"p": {"forward, x": (n, n * 3.0), "backward, x": (n, n * 5.0)},
              "q": {"backward, x": (n, n * 7.0)}}
    fig = plots.traffic_curves(panels)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.lines}
    assert set(lines) == {"p:forward, x", "p:backward, x", "q:backward, x"}
    assert np.array_equal(lines["q:backward, x"].get_ydata(), n * 7.0)
    assert lines["p:forward, x"].get_linestyle() == "--"
    assert lines["p:backward, x"].get_linestyle() == "-"
    assert lines["p:backward, x"].get_color() == lines["q:backward, x"].get_color()
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes)
    assert _text_below(fig, SMALLEST_TEXT_PT) == []
    plt.close(fig)
    with pytest.raises(ValueError, match=r"shapes \(3,\) and \(2,\)"):
        plots.traffic_curves({"p": {"a": (n, n[:2])}})
    with pytest.raises(ValueError, match="log axes need positive"):
        plots.traffic_curves({"p": {"a": (n, 0 * n)}})
    with pytest.raises(ValueError, match="at least one panel"):
        plots.traffic_curves({})
