"""The engine timing truth model: fit quality, monotonicity, scaling, noise, KV capacity."""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_operator.engine_sim import truth
from rooftop_operator.engine_sim.truth import TruthModel

H100_8B = ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto")


def test_fit_error_within_stated_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    """Refit from calibration.csv: median |rel err| <= 12 % (decode) / 10 % (prefill)."""
    if not truth.DEFAULT_CALIBRATION.exists():
        pytest.skip("shared calibration data not mounted")
    assert truth.main(["--fit"]) == 0
    out = capsys.readouterr().out
    assert "decode   all" in out and "prefill  all" in out
    doc, _ = truth.fit()
    dec, pre = doc["errors"]["decode"]["all"], doc["errors"]["prefill"]["all"]
    assert dec["n"] > 2000
    assert dec["median_abs"] < 0.12 and dec["p90_abs"] < 0.35
    assert pre["median_abs"] < 0.10 and pre["p90_abs"] < 0.35
    # every fitted coefficient is a non-negative inverse efficiency
    assert all(c >= 0 for coefs in doc["decode"].values() for c in coefs)


def test_stored_fit_covers_measured_gpus() -> None:
    doc = truth.load_fit()
    for gpu in ("generic", "h100-sxm", "a100-80gb", "h200", "l40s"):
        assert gpu in doc["decode"] and gpu in doc["prefill"]


def test_decode_grows_with_batch_and_context() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    assert t.fit_source == "gpu:h100-sxm"
    steps = [t.decode_step_s(b, b * 1000) for b in (1, 8, 64, 256)]
    assert steps == sorted(steps) and steps[0] > 0.003  # ~8 ms for 16 GB of bf16 weights
    assert t.decode_step_s(32, 32 * 4000) > t.decode_step_s(32, 32 * 100)
    assert t.decode_step_s(0, 0) == 0.0


def test_prefill_and_mixed_steps() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    assert t.prefill_s(4096) > t.prefill_s(1024) > t.prefill_s(128) > 0
    decode_only = t.step_s(16, 16 * 1000, 0, 0)
    mixed = t.step_s(16, 16 * 1000, 512, 512 * 257)
    assert decode_only == pytest.approx(t.decode_step_s(16, 16 * 1000))
    assert decode_only < mixed < decode_only + t.prefill_s(512)


def test_tensor_parallel_and_unmeasured_gpu() -> None:
    tp1 = TruthModel.for_deployment("llama-3.1-70b", "h100-sxm", 2, "bf16", "auto")
    tp4 = TruthModel.for_deployment("llama-3.1-70b", "h100-sxm", 4, "bf16", "auto")
    assert tp4.decode_step_s(1, 1000) < tp1.decode_step_s(1, 1000)
    l4 = TruthModel.for_deployment("llama-3.1-8b", "NVIDIA-L4", 1, "bf16", "auto")
    assert l4.fit_source == "generic"  # no measured L4 rows: bandwidth-based generic set
    assert l4.decode_step_s(1, 100) > 5 * TruthModel.for_deployment(*H100_8B).decode_step_s(1, 100)


def test_reality_factor_scales_and_noise_is_seeded_mean_one() -> None:
    base = TruthModel.for_deployment(*H100_8B)
    slow = TruthModel.for_deployment(*H100_8B, reality_factor=1.5)
    assert slow.decode_step_s(8, 8000) == pytest.approx(1.5 * base.decode_step_s(8, 8000))
    a = TruthModel.for_deployment(*H100_8B, noise=0.2, seed=7)
    b = TruthModel.for_deployment(*H100_8B, noise=0.2, seed=7)
    xs = np.array([a.decode_step_s(8, 8000) for _ in range(4000)])
    assert list(xs[:5]) == [b.decode_step_s(8, 8000) for _ in range(5)]
    assert xs.std() > 0
    assert xs.mean() == pytest.approx(base.decode_step_s(8, 8000), rel=0.03)


def test_kv_capacity() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    cap = t.kv_capacity_tokens(0.9)
    # (72 GiB - 16 GB weights - 2 GiB overhead) / 128 KiB per token ~ 440k tokens
    assert 350_000 < cap < 520_000 and cap % 16 == 0
    assert t.kv_capacity_tokens(0.5) < cap
    fp8 = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "bf16", "fp8")
    assert fp8.kv_capacity_tokens(0.9) == pytest.approx(2 * cap, rel=0.01)
    with pytest.raises(ValueError):
        t.kv_capacity_tokens(0.0)


def test_names_resolve_and_unknowns_fail() -> None:
    assert truth.gpu_shape("NVIDIA-H100-80GB-HBM3").id == "h100-sxm"
    assert truth.gpu_shape("H100 NVL").id == "h100-nvl"
    assert truth.model_shape("meta-llama/Llama-3.1-8B-Instruct").id == "llama-3.1-8b"
    with pytest.raises(KeyError):
        TruthModel.for_deployment("llama-3.1-8b", "tpu-v9", 1, "bf16", "auto")
    with pytest.raises(KeyError):
        truth.model_shape("no-such-model-13b")


def test_nnls_matches_known_solution() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, size=(50, 4))
    x_true = np.array([0.5, 0.0, 2.0, 1.0])
    x = truth.nnls(a, a @ x_true)
    assert np.allclose(x, x_true, atol=1e-8)
    # a negative unconstrained optimum is clamped to zero
    x = truth.nnls(a, a @ np.array([1.0, -1.0, 1.0, 1.0]))
    assert (x >= 0).all() and x[1] == 0
