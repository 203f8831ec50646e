"""How the simulated cluster routes requests to pods (``ClusterConfig.routing``), and
what that does to the prefix cache's hit ratio the window reads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rooftop_planner.pricing import GpuPrice, ReplicaPrice
from rooftop_sim.cluster import Cluster, ClusterConfig, FixedPool, Replica, RequestStream
from rooftop_sim.policies import FixedPolicy, SchedulePolicy
from rooftop_sim.report import cost
from rooftop_sim.traces import PrefixBlocks, load_trace
from rooftop_sim.window import Gauges

MOONCAKE = Path(__file__).resolve().parents[3] / "examples/traces/mooncake_conversation.jsonl"
REPLICA = Replica("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto", 3.0, max_model_len=131072)


def run(
    w: RequestStream,
    routing: str,
    replicas: int = 4,
    seed: int = 0,
    replica: Replica = REPLICA,
) -> Cluster:
    cluster = Cluster(w, ClusterConfig(replica, noise=0.0, seed=seed, routing=routing))
    cluster.run(FixedPolicy(replicas, 64))
    return cluster


def steady(n: int, gap_s: float, output: int, sessions: int | None = None) -> RequestStream:
    """``n`` 100-token prompts every ``gap_s`` s; session keys cycling over ``sessions``."""
    keys = None if sessions is None else np.arange(n, dtype=np.int64) % sessions
    return RequestStream(
        np.arange(n) * gap_s, np.full(n, 100), np.full(n, output), "steady", session=keys
    )


def hit_ratio(cluster: Cluster) -> float:
    """The window's served_prefix_hit_ratio once every request has finished."""
    end = float(np.nanmax(cluster.fin)) + 1.0
    obs = cluster.window.observe(end, 0.0, Gauges(0.0, 0.0, 0.0, 1, 0))
    return obs.served_prefix_hit_ratio.value


def test_least_outstanding_fills_the_first_idle_pod_and_random_spreads() -> None:
    """At one light request a second every pod is idle when a request comes: the
    gateway always takes the first; kube-proxy picks uniformly."""
    w = steady(400, 1.0, 10)
    assert np.bincount(run(w, "least-outstanding").routed, minlength=4).tolist() == [400, 0, 0, 0]
    spread = np.bincount(run(w, "random").routed, minlength=4)
    assert spread.min() > 0.15 * 400


def test_random_routing_follows_the_seed() -> None:
    w = steady(100, 1.0, 10)
    assert (run(w, "random").routed == run(w, "random").routed).all()
    assert (run(w, "random").routed != run(w, "random", seed=1).routed).any()


def test_a_session_sticks_to_the_pod_it_first_went_to() -> None:
    w = steady(400, 1.0, 10, sessions=20)
    routed = run(w, "session").routed
    assert w.session is not None
    for key in range(20):
        assert len(set(routed[w.session == key].tolist())) == 1
    assert len(set(routed.tolist())) >= 3  # the sessions themselves are spread


def test_a_session_is_re_pinned_when_its_pod_leaves() -> None:
    """Two pods, then one from the scrape at 105 s: the sessions of the pod that
    drains move to the other; those already there stay; none lands on a draining pod."""
    w = steady(200, 1.0, 10, sessions=10)
    cluster = Cluster(w, ClusterConfig(REPLICA, noise=0.0, routing="session"))
    cluster.run(SchedulePolicy([2, 1], 100.0, 64))
    assert w.session is not None
    routed, after = cluster.routed, w.arrival_s > 106.0
    survivor = routed[-1]
    assert (routed[after] == survivor).all()
    moved = [k for k in range(10) if (routed[(w.session == k) & ~after] != survivor).all()]
    stayed = [k for k in range(10) if (routed[w.session == k] == survivor).all()]
    assert moved and stayed and len(moved) + len(stayed) == 10


def with_prefixes(
    arrivals: list[float], blocks: list[list[int]], outputs: list[int]
) -> RequestStream:
    """Requests whose prompts are their 512-token blocks in full."""
    prompts = np.array([512 * len(b) for b in blocks])
    return RequestStream(
        np.array(arrivals),
        prompts,
        np.array(outputs),
        "prefixes",
        PrefixBlocks.from_lists(blocks, 512),
    )


def test_prefix_aware_goes_to_the_pod_holding_the_prefix() -> None:
    """A long answer keeps pod 0 busy with prompt [1..4]; pod 1 served [9..12] and is
    idle. A prompt that continues [1..4] goes to pod 0, where 2,048 of its 3,072 tokens
    are cached; the gateway sends it to the idle pod 1."""
    w = with_prefixes(
        [0.0, 0.0, 10.0], [[1, 2, 3, 4], [9, 10, 11, 12], [1, 2, 3, 4, 5, 6]], [3000, 1, 1]
    )
    assert run(w, "prefix-aware", replicas=2).routed.tolist() == [0, 1, 0]
    assert run(w, "least-outstanding", replicas=2).routed.tolist() == [0, 1, 1]


def test_a_prefix_every_prompt_shares_does_not_pull_every_request_to_one_pod() -> None:
    """Every prompt starts with block 0 (a system prompt) and is otherwise its own: the
    pod that cached block 0 first holds an eighth of each prompt, too little to follow,
    so load decides."""
    n = 200
    w = with_prefixes(
        list(np.arange(n) * 0.05),
        [[0, *range(10 * k + 1, 10 * k + 8)] for k in range(n)],
        [200] * n,
    )
    counts = np.bincount(run(w, "prefix-aware").routed, minlength=4)
    assert counts.max() < 0.5 * n


@pytest.fixture(scope="module")
def mooncake_head() -> RequestStream:
    """The first 400 requests (141 s) of Mooncake's conversation trace."""
    t = load_trace(MOONCAKE, max_rows=400)
    return RequestStream(
        t.arrival_s, t.prompt_tokens, t.output_tokens, "mooncake", t.prefix, t.session
    )


def unbounded_hit_ratio(w: RequestStream) -> float:
    """Prompt tokens of leading 512-token blocks some earlier request already had, over
    all prompt tokens: one replica's hit ratio with a cache that never evicts."""
    assert w.prefix is not None
    seen: set[int] = set()
    found = 0
    for i in range(len(w.arrival_s)):
        ids = w.prefix.of(i).tolist()
        k = next((k for k, h in enumerate(ids) if h not in seen), len(ids))
        found += min(512 * k, int(w.prompt_tokens[i]))
        seen.update(ids)
    return found / float(w.prompt_tokens.sum())


def test_with_room_for_every_prompt_session_routing_finds_all_one_cache_would(
    mooncake_head: RequestStream,
) -> None:
    """8 B200s per pod hold 10 M tokens of KV, more than the 4.8 M these prompts have:
    nothing is evicted. With each session pinned, 4 replicas find every block an
    earlier request of the trace had (13.7 % of the tokens, what one replica with a
    cache that never evicts would find); spread at random, a turn finds its
    predecessor on its pod a quarter of the time, and the shared first block always."""
    roomy = replace(REPLICA, gpu="b200", tp=8)
    session = hit_ratio(run(mooncake_head, "session", replica=roomy))
    spread = hit_ratio(run(mooncake_head, "random", replica=roomy))
    assert session == pytest.approx(unbounded_hit_ratio(mooncake_head), abs=0.005)
    assert spread < 0.6 * session


def test_with_an_h100s_cache_session_routing_still_finds_more(
    mooncake_head: RequestStream,
) -> None:
    """One H100 holds 450 k tokens, some 37 of these prompts: a turn 40 s after its
    predecessor mostly finds it evicted, so both ratios fall far below the unbounded
    cache's; a pinned session still finds more, its pod serving a quarter of the
    traffic and so keeping four times as long a history of it."""
    session = hit_ratio(run(mooncake_head, "session"))
    spread = hit_ratio(run(mooncake_head, "random"))
    assert spread < session < 0.5 * unbounded_hit_ratio(mooncake_head)


CHAT_TARGET = {
    "apiVersion": "rooftop.dev/v1alpha1",
    "kind": "ServingTarget",
    "metadata": {"name": "kimi-like"},
    "spec": {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 100},
        "workload": {
            "requestsPerSecond": 3.0,
            "promptTokens": {"mean": 12000, "p90": 27000},
            "outputTokens": {"mean": 340, "p90": 700},
        },
        "budget": {"usdPerHour": 100},
        "constraints": {"gpuTypes": ["h100-sxm"], "maxReplicas": 4},
    },
}


def simulate_cli(tmp_path: Path, *flags: str) -> int:
    import yaml

    from rooftop_cli.main import main

    target = tmp_path / "t.yaml"
    target.write_text(yaml.safe_dump(CHAT_TARGET))
    trace = tmp_path / "head.jsonl"
    with MOONCAKE.open() as fh:
        trace.write_text("".join(fh.readline() for _ in range(150)))
    return main(["simulate", str(target), "--trace", str(trace), "--policy", "static-peak", *flags])


def test_rooftop_simulate_routes_as_told_and_reports_the_hit_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate_cli(tmp_path, "--routing", "session", "-o", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prefix_hit_ratio"] > 0.03  # the shared first block at least


def test_an_unknown_routing_is_refused_naming_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        simulate_cli(tmp_path, "--routing", "sticky")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--routing: invalid choice: 'sticky'" in err and "prefix-aware" in err


def test_a_cluster_refuses_an_unknown_routing() -> None:
    with pytest.raises(ValueError, match="routing 'sticky': choose from least-outstanding"):
        ClusterConfig(REPLICA, routing="sticky")


def test_a_mixed_fleet_spreads_over_both_pools_and_bills_each_at_its_price() -> None:
    """Two policy pods of H100 beside two fixed L40S pods: random routing sends about a
    quarter of the requests to each pod, the policy never touches the fixed pods, and
    the bill adds their GPU-hours and price to the policy's."""
    l40s = Replica("llama-3.1-8b", "l40s", 1, "bf16", "auto", 1.0, max_model_len=131072)
    w = steady(800, 0.5, 10)
    config = ClusterConfig(
        REPLICA, noise=0.0, routing="random", fixed_pools=(FixedPool(l40s, 2, 32),)
    )
    cluster = Cluster(w, config)
    result = cluster.run(FixedPolicy(2, 64))
    assert [(p.pool is None, p.cap) for p in cluster.pods] == [
        (True, 64), (True, 64), (False, 32), (False, 32)]  # fmt: skip
    share = np.bincount(cluster.routed, minlength=4) / len(w.arrival_s)
    assert share.min() > 0.18 and np.isfinite(cluster.fin).all()
    hours = w.horizon_s / 3600.0
    assert result.pod_seconds == pytest.approx(2 * w.horizon_s)
    assert result.fixed_gpu_hours == pytest.approx(2 * hours)
    assert result.fixed_usd == pytest.approx(2 * hours * 1.0)
    gpu_hours, usd = cost(result)
    assert gpu_hours == pytest.approx(4 * hours) and usd == pytest.approx(2 * hours * 4.0)


def test_a_policy_scaling_to_zero_leaves_the_fixed_pool_serving() -> None:
    l40s = Replica("llama-3.1-8b", "l40s", 1, "bf16", "auto", 1.0, max_model_len=131072)
    w = steady(200, 1.0, 10)
    config = ClusterConfig(REPLICA, noise=0.0, startup_s=0.0, fixed_pools=(FixedPool(l40s, 1, 32),))
    cluster = Cluster(w, config)
    cluster.run(SchedulePolicy([2, 0], 30.0, 64))  # two pods, gone after 30 s
    assert np.isfinite(cluster.fin).all() and cluster.rejected == 0
    assert {cluster.pods[i].pool is not None for i in cluster.routed[60:]} == {True}


def test_owned_gpus_are_billed_first_whichever_pods_run() -> None:
    """Three pods of one GPU over two owned GPUs at $0: the fleet pays for one pod, the
    one beyond the owned GPUs, for the whole trace."""
    w = steady(100, 1.0, 10)
    price = ReplicaPrice(GpuPrice(3.0, owned=2), tp=1)
    result = Cluster(w, ClusterConfig(REPLICA, noise=0.0, price=price)).run(FixedPolicy(3, 64))
    assert cost(result)[1] == pytest.approx(3.0 * w.horizon_s / 3600.0)
    flat = Cluster(w, ClusterConfig(REPLICA, noise=0.0)).run(FixedPolicy(3, 64))
    assert cost(flat)[1] == pytest.approx(3 * 3.0 * w.horizon_s / 3600.0)
