"""The scale benchmark's live exporter (``benchmarks/live_engines.py``): one scrape target
per engine pod, vLLM's families behind each, figures that differ per target."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from rooftop_sim.engine.vllm_metrics import FINISHED_REASONS


@pytest.fixture
def live(load_benchmark: Any) -> Iterator[tuple[ModuleType, list[dict[str, Any]], list[Any]]]:
    module = load_benchmark("live_engines")
    pods: list[dict[str, Any]] = []
    written: list[Any] = []
    yield module, pods, written


def pod(ns: str, name: str, target: str | None) -> dict[str, Any]:
    labels = {"rooftop.dev/servingtarget": target} if target else {}
    return {"metadata": {"namespace": ns, "name": name, "labels": labels}}


def metric(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (no suffix matching) in an exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_each_engine_pod_is_one_scrape_target_with_its_targets_labels(live: Any) -> None:
    module, pods, written = live
    pods += [pod("a", "chat-1-x", "chat-1"), pod("a", "chat-1-y", "chat-1"),
             pod("b", "other", None)]  # fmt: skip
    engines = module.LiveEngines(lambda: pods, written.append, tick_s=15.0)
    try:
        engines.refresh()
        (targets,) = written
        assert sorted(labels["pod"] for _, labels in targets) == ["chat-1-x", "chat-1-y"]
        address, labels = targets[0]
        assert address == engines.address
        assert labels["__metrics_path__"] == f"/metrics/a/{labels['pod']}"
        assert labels["namespace"] == "a" and labels["servingtarget"] == "chat-1"
        engines.refresh()
        assert len(written) == 1  # the same pods: the targets are not rewritten
        pods.pop(0)
        engines.refresh()
        assert [labels["pod"] for _, labels in written[-1]] == ["chat-1-y"]
    finally:
        engines.stop()


def test_a_pods_series_count_what_it_served(live: Any) -> None:
    module, pods, written = live
    pods.append(pod("a", "chat-1-x", "chat-1"))
    engines = module.LiveEngines(lambda: pods, written.append, tick_s=15.0).start()
    try:
        engine = engines.pods[("a", "chat-1-x")]
        engine.serve(60.0, pods=1)  # a minute of the target's traffic
        url = f"http://{engines.address}/metrics/a/chat-1-x"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        served = metric(text, "vllm:request_success_total")
        assert served > 0
        assert metric(text, "vllm:request_prompt_tokens_count") == served
        hits = metric(text, "vllm:prefix_cache_hits_total")
        queries = metric(text, "vllm:prefix_cache_queries_total")
        assert hits / queries == pytest.approx(engine.profile.hit_ratio, abs=0.01)
        assert text.count("vllm:request_success_total{") == len(FINISHED_REASONS)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{engines.address}/metrics/a/absent", timeout=5)
    finally:
        engines.stop()


def test_counters_grow_with_the_time_between_scrapes(live: Any) -> None:
    """Requests finish as time passes, whenever Prometheus scrapes: a window's rate
    follows the traffic, not how the exporter's clock and the scrapes line up."""
    module, pods, written = live
    pods += [pod("a", "chat-1-x", "chat-1"), pod("a", "chat-1-y", "chat-1")]
    engines = module.LiveEngines(lambda: pods, written.append, tick_s=15.0)
    try:
        engines.refresh()
        engine = engines.pods[("a", "chat-1-x")]
        assert engine.pods == 2  # its share is half the target's rate
        clock = [engine.served_at]
        engine.clock = lambda: clock[0]
        finished = []
        for gap_s in (600.0, 1200.0):
            clock[0] += gap_s
            text = engine.scrape().decode()
            finished.append(metric(text, "vllm:request_success_total"))
        first, second = finished[0], finished[1] - finished[0]
        expected = engine.profile.rate / 2
        assert first / 600.0 == pytest.approx(expected, rel=0.25)
        assert second / 1200.0 == pytest.approx(expected, rel=0.2)
    finally:
        engines.stop()


def test_targets_differ_in_lengths_and_hit_rates(live: Any) -> None:
    module, _, _ = live
    profiles = [module.Profile.of(f"sim-chat-{i:04d}") for i in range(20)]
    assert len({round(p.prompt) for p in profiles}) > 10
    assert len({round(p.hit_ratio, 2) for p in profiles}) > 10
    assert module.Profile.of("sim-chat-0001") == profiles[1]  # stable across runs
