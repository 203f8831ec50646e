"""rooftop_planner.lifecycle: how long a pod drains and starts, from the plan and the
workload; each row's arithmetic is written out beside it."""

from __future__ import annotations

from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import lifecycle as lc
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.plan import Plan


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def spec(**over: Any) -> ServingTargetSpec:
    base: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 50, "ttftMs": 1000},
        "workload": {"requestsPerSecond": 4, "promptTokens": {"mean": 512},
                     "outputTokens": {"mean": 200}},
        "budget": {"usdPerHour": 20},
    }  # fmt: skip
    return ServingTargetSpec.model_validate({**base, **over})


def plan(**over: Any) -> Plan:
    fields: dict[str, Any] = {
        "gpu": "h100-sxm", "tp": 1, "replicas": 2, "max_num_seqs": 64, "weight_dtype": "bf16",
        "kv_dtype": "auto", "max_model_len": 4096, "gpu_memory_utilization": 0.9,
        "tpot_ms": 30.0, "ttft_ms": 200.0, "output_tok_s": 1500.0, "usd_per_hour": 6.98,
    }  # fmt: skip
    return Plan(**{**fields, **over})


def test_the_drain_covers_the_p99_request_at_the_slo() -> None:
    """Every request has 200 output tokens: 1 s TTFT + 200 x 50 ms = 11 s; x1.5 = 16.5,
    so 17 s, below the 30 s floor: 30 s."""
    assert lc.request_p99_s(spec(), plan()) == pytest.approx(11.0)
    assert lc.shutdown_timeout_s(11.0) == lc.MIN_SHUTDOWN_S == 30


def test_a_long_tailed_output_length_drains_longer() -> None:
    """Output mean 500, p90 1,000 (log-normal, sigma 0.776): p99 is about 2,250 tokens,
    so 1 s + 2,250 x 50 ms = 113 s, and the drain 1.5 x that = 170 s."""
    long = spec(workload={"requestsPerSecond": 4, "promptTokens": {"mean": 512},
                          "outputTokens": {"mean": 500, "p90": 1000}})  # fmt: skip
    request = lc.request_p99_s(long, plan())
    assert 105 < request < 120
    assert lc.shutdown_timeout_s(request) == pytest.approx(1.5 * request, abs=1)


def test_the_output_length_is_capped_by_the_context_and_the_drain_by_an_hour() -> None:
    """A p99 of 20,000 tokens cannot run past max-model-len 4,096: 1 s + 4,096 x 0.05."""
    long = spec(workload={"requestsPerSecond": 1, "promptTokens": {"mean": 512},
                          "outputTokens": {"mean": 20000}})  # fmt: skip
    assert lc.request_p99_s(long, plan()) == pytest.approx(1 + 4096 * 0.05)
    assert lc.shutdown_timeout_s(1e6) == lc.MAX_SHUTDOWN_S


def test_without_a_ttft_slo_the_plans_own_prediction_counts() -> None:
    """200 ms predicted TTFT + 200 x 50 ms = 10.2 s."""
    no_ttft = spec(slo={"tpotMs": 50})
    assert lc.request_p99_s(no_ttft, plan()) == pytest.approx(10.2)


def test_the_grace_period_outlasts_the_longest_prestop_and_the_drain(catalog: Catalog) -> None:
    """The preStop waits for kept-alive connections for at most one request beyond its
    minimum; the engine's drain then finishes the requests that came in meanwhile."""
    life = lc.lifecycle(spec(), plan(), catalog.model("llama-3.1-8b"), None)
    assert life.prestop_max_s == life.prestop_s + life.shutdown_timeout_s
    assert life.grace_s == life.prestop_max_s + life.shutdown_timeout_s + lc.GRACE_MARGIN_S
    assert life.shutdown_timeout_s >= life.request_p99_s


def test_start_up_counts_the_download_only_without_a_persistent_cache(catalog: Catalog) -> None:
    """Llama-3.1-8B bf16 is about 16 GB: 80 s to download at 200 MB/s, 16 s to load at
    1 GB/s, 90 s of warm-up: about 186 s; with a PVC cache 106 s."""
    model = catalog.model("llama-3.1-8b")
    fresh = lc.lifecycle(spec(), plan(), model, None)
    cached = lc.lifecycle(spec(engine={"modelCache": {"pvcName": "hf"}}), plan(), model, None)
    assert 15e9 < fresh.checkpoint_bytes < 17e9
    assert fresh.downloads and not cached.downloads
    assert fresh.startup_s == pytest.approx(cached.startup_s + fresh.checkpoint_bytes / 200e6)
    assert 170 < fresh.startup_s < 200
    # the node's disk holds the download (plus scratch); a cached pod needs scratch only
    assert fresh.ephemeral_bytes > fresh.checkpoint_bytes > cached.ephemeral_bytes
    assert cached.ephemeral_bytes == lc.SCRATCH_BYTES


def test_a_70b_checkpoint_gets_a_deadline_past_kubernetes_ten_minutes(catalog: Catalog) -> None:
    """Llama-3.1-70B bf16 is about 141 GB: 705 s download + 141 s load + 90 s = 936 s;
    the deadline is twice that plus a 50 s image pull: about 1,970 s, not 600 s."""
    big = spec(model="llama-3.1-70b")
    life = lc.lifecycle(big, plan(tp=4), catalog.model("llama-3.1-70b"), None)
    assert 900 < life.startup_s < 980
    assert life.progress_deadline_s == pytest.approx(2 * (life.startup_s + 50), abs=1)


def test_online_fp8_downloads_the_16_bit_checkpoint(catalog: Catalog) -> None:
    """vLLM quantizes to fp8 at load: the disk holds 2 bytes a weight, not 1."""
    from rooftop_planner.weights import ONLINE_FP8, Weights

    model = catalog.model("llama-3.1-8b")
    online = Weights("meta-llama/Llama-3.1-8B-Instruct", "fp8", ONLINE_FP8, "")
    assert lc.checkpoint_bytes(model, "fp8", online) == lc.checkpoint_bytes(model, "bf16", None)
    assert lc.checkpoint_bytes(model, "fp8", None) < lc.checkpoint_bytes(model, "bf16", None)


def test_a_simulated_engine_downloads_nothing(catalog: Catalog) -> None:
    life = lc.lifecycle(spec(mode="simulated"), plan(), catalog.model("llama-3.1-8b"), None)
    assert (life.downloads, life.checkpoint_bytes) == (False, 0.0)
    assert life.startup_s == lc.SIMULATED_STARTUP_S
