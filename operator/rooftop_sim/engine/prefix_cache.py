"""vLLM V1's automatic prefix caching, as block bookkeeping (``v1/core/block_pool.py``).

The KV cache is ``num_blocks`` blocks of ``block_size`` tokens. A full block of a prompt
has a hash that identifies the whole prefix through it (chained: equal hashes mean equal
prefixes), so a request that starts with a cached prefix reuses those blocks instead of
prefilling them. The rules, as vLLM applies them:

- a block is cached once it is full and scheduled (vLLM hashes it when it allocates the
  slots for the tokens that fill it); a hash already cached keeps its first block, and
  the later copy stays private to its request (vLLM keeps both; a lookup finds one);
- a request's cache hit is the longest run of leading block hashes found in the cache;
- blocks in use are reference-counted: two running requests sharing a prefix hold those
  blocks once;
- a freed block goes to the free queue. Blocks without a hash (never cacheable: a
  request's partial last block, its output, or a duplicate) are reused first; cached ones
  stay findable, queued least recently freed first, and are evicted in that order when a
  new block is needed. A request frees its blocks last to first, so a prefix's tail is
  evicted before its head;
- free blocks, cached or not, are what ``kv_cache_usage`` counts as free.

Only counts and hashes are kept (no block ids): an admission costs one dict look-up per
block of its prompt, and nothing is done per token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Free blocks and the cached block hashes of one engine's KV cache.

    Args:
        num_blocks: KV blocks in the cache.
        enabled: cache full blocks (vLLM's ``--enable-prefix-caching``); when False
            every block is private and nothing is ever found.
    """

    def __init__(self, num_blocks: int, enabled: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enabled = enabled
        self.free_uncached = num_blocks  # free blocks holding nothing findable
        # hash -> requests holding that block (0: free, waiting in the LRU queue below)
        self._refs: dict[int, int] = {}
        # free cached blocks, least recently freed first (the eviction order)
        self._lru: OrderedDict[int, None] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request, cached ones included (vLLM's free queue)."""
        return self.free_uncached + len(self._lru)

    @property
    def cached_blocks(self) -> int:
        """Blocks whose hash can be found, held or free."""
        return len(self._refs)

    def longest_hit(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """(leading blocks of ``hashes`` found in the cache, at most ``max_blocks``; how
        many of those are free: taking them out of the free queue costs as much as
        allocating new ones)."""
        if not self.enabled:
            return 0, 0
        refs = self._refs
        found = free = 0
        for h in hashes[:max_blocks]:
            held = refs.get(h)
            if held is None:
                break
            found += 1
            free += not held
        return found, free

    def touch(self, hashes: Sequence[int], count: int) -> None:
        """Hold the first ``count`` hashes' cached blocks for one more request."""
        refs, lru = self._refs, self._lru
        for k in range(count):
            h = hashes[k]
            if refs[h] == 0:
                del lru[h]
            refs[h] += 1

    def allocate(self, count: int) -> None:
        """Take ``count`` free blocks: uncached ones first, then the least recently
        freed cached ones, whose hashes are forgotten (evicted). The caller checked
        that ``count <= free_blocks``."""
        take = min(count, self.free_uncached)
        self.free_uncached -= take
        refs, lru = self._refs, self._lru
        for _ in range(count - take):
            h, _ = lru.popitem(last=False)
            del refs[h]

    def register(self, hashes: Sequence[int]) -> list[int]:
        """Blocks a request holds became full: cache them under ``hashes``. Returns
        those cached; the others stay private (caching off, or a hash already cached
        by another block)."""
        if not self.enabled:
            return []
        refs = self._refs
        new = [h for h in hashes if h not in refs]
        refs.update(dict.fromkeys(new, 1))
        return new

    def free(self, held: Sequence[int], private: int) -> None:
        """A request lets go of its blocks: ``held``, the cached ones in prompt order,
        and ``private`` blocks nobody can find. Cached blocks nobody else holds join
        the eviction queue last block first."""
        self.free_uncached += private
        refs, lru = self._refs, self._lru
        for h in reversed(held):
            left = refs[h] - 1
            refs[h] = left
            if left == 0:
                lru[h] = None


def chain_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Hashes of the full ``block_size``-token blocks of ``token_ids``, each of its
    parent's hash and its own tokens (vLLM's ``hash_block_tokens``), so equal hashes
    mean equal prefixes. Python's hash of a tuple of ints is the same in every process."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        out.append(parent)
    return tuple(out)
