"""Prompt lookup and suffix decoding on the real vLLM (CPU build): what the loop reads
an ``ngram`` or ``suffix`` acceptance from holds there.

The planner prices ``ngram`` with an acceptance per decode step (a step where the
lookup finds no match counts as one whose first draft was rejected), and the loop reads
it from vLLM's counters: accepted per draft times drafts per decode step, the decode
steps counted by the inter-token latency histogram, which vLLM observes once per
request and decode step (``traffic.measured_acceptance``). This serves the tiny model
with ``{"method": "ngram"}``, then with ``{"method": "suffix"}`` (Arctic Inference's
suffix trees, which tests/engine/install-vllm.sh builds into the engine's venv), sends
prompts that repeat a phrase (so the lookup finds matches, as in code edits) and checks
that identity on the engine's own counters: each
decode step of a request yields 1 + its accepted drafts, so the latencies counted are
the tokens generated less the first of each request less the accepted ones.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rooftop_control import traffic
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_planner.drafters import acceptance_from_length
from tests.cluster.vllm_engines import local_engine

pytestmark = pytest.mark.vllm

SERVED = "tiny"
DRAFT_TOKENS = 3
SPECULATIONS = {
    "ngram": (
        f'{{"method": "ngram", "num_speculative_tokens": {DRAFT_TOKENS}, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 3}'
    ),
    # one draft length at every batch, as the planner renders it
    "suffix": f'{{"method": "suffix", "num_speculative_tokens": {DRAFT_TOKENS}}}',
}
# A phrase of 8 token ids said 12 times, a new phrase per request, answered greedily;
# then one prompt of distinct token ids, where the lookup finds nothing at first
PHRASE, REPEATS, OUTPUT_TOKENS, PHRASES = 8, 12, 48, 6
REQUESTS = PHRASES + 1


def scrape(base_url: str) -> dict[str, float]:
    """Every sample's value by its name (one engine, no labels that matter here)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels and "position" not in sample.labels:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def drive(base_url: str) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            phrases = [[100 + 10 * i + j for j in range(PHRASE)] * REPEATS for i in range(PHRASES)]
            for prompt in [*phrases, list(range(1000, 1000 + PHRASE * REPEATS))]:
                body = {"model": SERVED, "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                        "temperature": 0.0, "ignore_eos": True}  # fmt: skip
                async with s.post(f"{base_url}/v1/completions", json=body) as resp:
                    answer = await resp.json()
                    assert resp.status == 200, answer
                assert answer["usage"]["completion_tokens"] == OUTPUT_TOKENS

    asyncio.run(main())


@dataclass(frozen=True)
class Served:
    """One engine's counters after the load, and the method it drafted by."""

    method: str
    counters: dict[str, float]


@pytest.fixture(scope="module", params=list(SPECULATIONS))
def served(
    request: pytest.FixtureRequest,
    vllm_py: Path,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    work = tmp_path_factory.mktemp(f"vllm-{request.param}")
    args = ["--speculative-config", SPECULATIONS[request.param]]
    with local_engine(vllm_py, tiny_model_dir, work, SERVED, args).serving() as engine:
        drive(engine.url)
        yield Served(request.param, scrape(engine.url))


def test_the_lookup_drafts_where_it_finds_a_match_only(served: Served) -> None:
    """The repeated phrases draft; with prompt lookup some decode steps (the distinct
    prompt's first) do not: drafts are fewer than decode steps, the share the loop
    multiplies by. Suffix trees also match the tiny model's own repetitive answers, so
    they may draft at every step."""
    counters = served.counters
    drafts = counters["vllm:spec_decode_num_drafts_total"]
    latencies = counters["vllm:inter_token_latency_seconds_count"]
    assert 0 < drafts <= latencies
    if served.method == "ngram":
        assert drafts < latencies
    assert counters["vllm:spec_decode_num_draft_tokens_total"] <= DRAFT_TOKENS * drafts


def test_one_latency_is_observed_per_request_and_decode_step(served: Served) -> None:
    """Latencies = tokens − first tokens − accepted drafts; the last step of a request
    may have accepted drafts past max_tokens, which its output drops (at most K each)."""
    counters = served.counters
    generated = counters["vllm:generation_tokens_total"]
    accepted = counters["vllm:spec_decode_num_accepted_tokens_total"]
    latencies = counters["vllm:inter_token_latency_seconds_count"]
    assert generated == REQUESTS * OUTPUT_TOKENS
    steps = generated - REQUESTS - accepted
    assert steps <= latencies <= steps + DRAFT_TOKENS * REQUESTS
    assert counters["vllm:spec_decode_num_drafts_total"] <= latencies


def test_the_loop_reads_the_acceptance_per_decode_step(served: Served) -> None:
    """The loop's three served-range readings over this engine's counters (Prometheus'
    rate ratios over one range are the counters' ratios) give the acceptance whose
    chain of K̄ drafts yields 1 + the drafts accepted per decode step (the answers keep
    a little less: a last step's drafts past max_tokens are accepted, then dropped);
    below the acceptance per draft wherever some decode step did not draft."""
    counters = served.counters
    drafts = counters["vllm:spec_decode_num_drafts_total"]
    accepted = counters["vllm:spec_decode_num_accepted_tokens_total"]
    latencies = counters["vllm:inter_token_latency_seconds_count"]
    length = counters["vllm:spec_decode_num_draft_tokens_total"] / drafts
    obs = Observation(
        served_accepted_per_draft=Reading(accepted / drafts, MetricState.OK),
        served_draft_length=Reading(length, MetricState.OK),
        served_drafted_share=Reading(drafts / latencies, MetricState.OK),
    )
    per_step = traffic.measured_acceptance(obs, per_decode_step=True)
    assert per_step is not None
    tokens_per_step = 1.0 + accepted / latencies
    kept_per_step = (REQUESTS * OUTPUT_TOKENS - REQUESTS) / latencies
    assert kept_per_step <= tokens_per_step
    solved = acceptance_from_length(min(tokens_per_step, 1.0 + length), length)
    assert per_step == pytest.approx(max(solved, traffic.ACCEPTANCE_STEP), abs=0.03)
    per_draft = traffic.measured_acceptance(obs)
    assert per_draft is not None and per_step <= per_draft
    if drafts < latencies:
        assert per_step < per_draft
