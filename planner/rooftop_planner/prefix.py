"""Prefix reuse: which prompt tokens vLLM's prefix cache already holds, by plan.

vLLM caches the KV of every full block of a prompt (16 tokens) under a hash of the whole
prefix through it, and a later prompt that starts with the same blocks skips their
prefill. Two kinds of reuse behave differently across replicas:

- **shared tokens** S (a system prompt, tool schemas) start every prompt: after its
  first request each replica holds them, so they hit on every replica;
- **session reuse**: a share f of a prompt's other tokens repeats an earlier request of
  the same session (the conversation so far). It hits only on the replica that served
  that request: with probability P = 1 when a prefix-aware router or ClientIP affinity
  keeps the session there, P = 1/R when the Service picks one of R replicas at random.

A prompt of p tokens then has, in expectation, cached tokens
    c(p) = min(S, p) + f · max(p − S, 0) · P
and prefills only n = p − c of them; each new token still attends to the c cached ones.
Assumed, not modelled: the cache keeps a session's blocks until its next request (they
are evicted least-recently-used when the KV cache runs full; the simulator does evict),
and under random spreading only the latest earlier request counts (a replica holding an
older turn of the same session would hit part of the history too: 1/R is a lower bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from rooftop_api.spec import PrefixReuse, Router

# vLLM's KV block (tokens): only whole blocks are cached, so a shared prefix hits in
# whole blocks.
BLOCK_TOKENS: Final = 16


@dataclass(frozen=True)
class PrefixModel:
    """What prompts repeat (see the module doc). Tokens; ``session_share`` 0..1."""

    shared_tokens: float = 0.0
    session_share: float = 0.0
    prefix_aware: bool = False
    client_ip_sessions: bool = False
    session_gap_s: float = 0.0  # mean time between a session's requests; 0: always cached

    @classmethod
    def from_spec(cls, prefix: PrefixReuse | None) -> PrefixModel:
        """The model ``spec.workload.prefix`` states; none: nothing repeats."""
        if prefix is None:
            return cls()
        return cls(
            shared_tokens=float(prefix.shared_tokens),
            session_share=prefix.session_share,
            prefix_aware=prefix.router is Router.PREFIX_AWARE,
            client_ip_sessions=prefix.client_ip_sessions,
            session_gap_s=prefix.session_gap_seconds or 0.0,
        )

    @property
    def reuses(self) -> bool:
        """True when any prompt token may be a cache hit."""
        return self.shared_tokens >= BLOCK_TOKENS or self.session_share > 0.0

    @property
    def depends_on_replicas(self) -> bool:
        """True when the hit rate falls as replicas are added (session reuse spread by the
        Service at random)."""
        return self.session_share > 0.0 and not self.prefix_aware

    @property
    def session_hits_vary(self) -> bool:
        """True when a session's history may miss: spread over replicas, or evicted
        before the session's next request."""
        return self.depends_on_replicas or (self.session_share > 0.0 and self.session_gap_s > 0)

    def affinity_options(self) -> tuple[bool, ...]:
        """Whether the Service may pin sessions (``sessionAffinity: ClientIP``): only for
        session reuse the Service would spread, and only where each session has its own
        client IP (through a gateway every request shares the gateway's few IPs, and
        affinity would put them all on a few replicas)."""
        if self.depends_on_replicas and self.client_ip_sessions:
            return (False, True)
        return (False,)

    def same_replica(self, replicas: int, affinity: bool) -> float:
        """P: the chance a session's earlier request ran on this request's replica."""
        if affinity or self.prefix_aware:
            return 1.0
        return 1.0 / max(replicas, 1)

    def kept(self, free_kv_tokens: float, written_tokens_per_s: float) -> float:
        """K: the chance a session's blocks are still cached at its next request. The
        cache evicts least-recently-used free blocks, so a block survives a gap g while
        the replica writes fewer than the free cache's C tokens meanwhile (g · w < C);
        with gaps exponential of mean ḡ, K = P(g < C / w) = 1 − exp(−C / (w · ḡ))."""
        if self.session_gap_s <= 0.0 or written_tokens_per_s <= 0.0:
            return 1.0
        return -math.expm1(-free_kv_tokens / (written_tokens_per_s * self.session_gap_s))

    def session_hit_chance(
        self, replicas: int, affinity: bool, free_kv_tokens: float, written_tokens_per_s: float
    ) -> float:
        """P · K: a session's earlier request ran on this replica and its blocks are still
        cached there (``same_replica`` and ``kept``)."""
        same = self.same_replica(replicas, affinity)
        return same * self.kept(free_kv_tokens, written_tokens_per_s)

    def cached_tokens(self, prompt: float, same: float) -> float:
        """c(p) = min(S, p) + f · max(p − S, 0) · P, tokens; S in whole blocks, and never
        the whole prompt (vLLM computes at least its last token)."""
        shared = min(self.shared_tokens // BLOCK_TOKENS * BLOCK_TOKENS, prompt)
        cached = shared + self.session_share * max(prompt - shared, 0.0) * same
        return min(cached, max(prompt - 1.0, 0.0))

    def hit_ratio(
        self, prompts: tuple[float, ...], weights: tuple[float, ...], same: float
    ) -> float:
        """Cached over prompt tokens, 0..1: Σ wᵢ c(pᵢ) / Σ wᵢ pᵢ over prompt strata."""
        total = sum(w * p for p, w in zip(prompts, weights, strict=True))
        cached = sum(w * self.cached_tokens(p, same) for p, w in zip(prompts, weights, strict=True))
        return cached / total if total > 0 else 0.0

    def shared_kv_tokens(self, mean_prompt: float) -> float:
        """Tokens of each running request's KV that the shared prefix's blocks hold once
        for all of them (running requests reference the same cached blocks)."""
        return min(self.shared_tokens // BLOCK_TOKENS * BLOCK_TOKENS, mean_prompt)

    def fitted(
        self, observed: float, prompts: tuple[float, ...], weights: tuple[float, ...], same: float
    ) -> PrefixModel:
        """The model whose hit ratio at ``same`` is ``observed`` (0..1): the stated shared
        tokens kept and the session share solved from the rest,
        f = (h · Σwp − Σw min(S,p)) / (P · Σw max(p − S, 0)), clipped to 0..1; where the
        shared tokens alone hit more than was observed, fewer shared tokens."""
        pairs = list(zip(prompts, weights, strict=True))
        shared_only = replace(self, session_share=0.0)
        from_shared = sum(w * shared_only.cached_tokens(p, same) for p, w in pairs)
        rest = sum(w * max(p - self.shared_tokens, 0.0) for p, w in pairs)
        wanted = observed * sum(w * p for p, w in pairs)
        if wanted < from_shared or rest <= 0.0 or same <= 0.0:
            kept = min(self.shared_tokens, wanted / max(sum(weights), 1e-12))
            return replace(self, shared_tokens=kept, session_share=0.0)
        share = min(max((wanted - from_shared) / (same * rest), 0.0), 1.0)
        return replace(self, session_share=share)
