"""KV blocks and the prefix cache of one simulated replica (vLLM V1 semantics).

The KV pool holds `total_blocks` blocks of `block_size` tokens (16 in vLLM).
Requests own blocks for the tokens they computed; finished prompt content stays
in the cache as *units* that later requests with the same prefix reuse.

How trace hash blocks map onto KV blocks: a trace describes prefix content with
one id per `hash_block_tokens` tokens (Mooncake: 512). The cache works at that
granularity: one unit = one hash block = `ceil(hash_block_tokens / block_size)`
KV blocks (512 / 16 = 32). Only *full* hash blocks are cached (vLLM caches only
full blocks too); a request's partial tail block is private. A lookup matches the
longest run of leading units present (ids are prefix-dependent, like vLLM's
chained block hashes), so a request whose first unit misses hits nothing.

Pinned units (referenced by a running request) are never evicted. Unreferenced
units sit in an LRU list; like vLLM's free-block queue they count as free space
and are evicted, least recently released first, only when an allocation needs
them. When a request releases its units they are appended tail-first so that a
prompt's last units are evicted before its first ones (vLLM frees a request's
blocks in reverse order for the same reason).

KV usage (vllm:kv_cache_usage_perc) = (blocks owned by requests + pinned unit
blocks) / total: cached-but-unreferenced blocks are free space, as in vLLM.

Must not: know about requests, time or the router; it is pure bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Block accounting plus an LRU over hash units. All sizes in KV blocks unless named `_tokens`."""

    __slots__ = ("total_blocks", "block_size", "unit_tokens", "unit_blocks", "enabled", "free_blocks",
                 "cached_blocks", "pinned_blocks", "_ref", "_lru", "evictions")

    def __init__(self, total_blocks: int, block_size: int, unit_tokens: int, enabled: bool = True) -> None:
        if total_blocks < 1:
            raise ValueError(f"total_blocks must be >= 1, got {total_blocks}")
        if block_size < 1 or unit_tokens < 1:
            raise ValueError(f"block_size ({block_size}) and unit_tokens ({unit_tokens}) must be >= 1")
        self.total_blocks = int(total_blocks)
        self.block_size = int(block_size)
        self.unit_tokens = int(unit_tokens)
        # 512-token hash block / 16-token KV blocks = 32 KV blocks per unit
        self.unit_blocks = -(-self.unit_tokens // self.block_size)
        self.enabled = enabled
        self.free_blocks = self.total_blocks  # neither owned by a request nor holding a cached unit
        self.cached_blocks = 0  # blocks holding cached units (pinned or not)
        self.pinned_blocks = 0  # of which referenced by running requests
        self._ref: dict[int, int] = {}  # unit hash -> reference count (0 = in the LRU list)
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced units, least recently released first
        self.evictions = 0  # units evicted (for tests and diagnostics)

    # ------------------------------------------------------------------ queries

    @property
    def evictable_blocks(self) -> int:
        return self.cached_blocks - self.pinned_blocks

    @property
    def available_blocks(self) -> int:
        """Blocks an allocation can get: free ones plus evictable cached ones."""
        return self.free_blocks + self.cached_blocks - self.pinned_blocks

    @property
    def usage_frac(self) -> float:
        """vllm:kv_cache_usage_perc: blocks referenced by requests / total."""
        return 1.0 - (self.free_blocks + self.cached_blocks - self.pinned_blocks) / self.total_blocks

    def __contains__(self, unit: int) -> bool:
        return unit in self._ref

    def __len__(self) -> int:
        return len(self._ref)

    def lru_order(self) -> list[int]:
        """Unreferenced units, next to be evicted first (for tests)."""
        return list(self._lru)

    def match(self, units: Sequence[int], max_units: int) -> int:
        """How many leading units of `units[:max_units]` are cached (a miss ends the match)."""
        if not self.enabled:
            return 0
        ref = self._ref
        n = 0
        for u in units:
            if n >= max_units or u not in ref:
                break
            n += 1
        return n

    # ------------------------------------------------------------------ blocks

    def allocate(self, n: int) -> bool:
        """Take `n` blocks for a request, evicting LRU units if needed. False (nothing changed) if short."""
        if n <= 0:
            return True
        if n <= self.free_blocks:
            self.free_blocks -= n
            return True
        if n > self.free_blocks + self.cached_blocks - self.pinned_blocks:
            return False
        lru = self._lru
        ref = self._ref
        ub = self.unit_blocks
        while self.free_blocks < n:
            unit, _ = lru.popitem(last=False)
            del ref[unit]
            self.cached_blocks -= ub
            self.free_blocks += ub
            self.evictions += 1
        self.free_blocks -= n
        return True

    def release(self, n: int) -> None:
        """Give back `n` request-owned blocks."""
        self.free_blocks += n

    # ------------------------------------------------------------------ units

    def pin(self, units: Sequence[int]) -> None:
        """Reference cached units (they must be present: call after `match`)."""
        ref = self._ref
        lru = self._lru
        ub = self.unit_blocks
        for u in units:
            c = ref[u]
            if c == 0:
                del lru[u]
                self.pinned_blocks += ub
            ref[u] = c + 1

    def unpin(self, units: Sequence[int]) -> None:
        """Drop references; units reaching zero join the LRU list, last unit first."""
        ref = self._ref
        lru = self._lru
        ub = self.unit_blocks
        for u in reversed(units):
            c = ref[u] - 1
            ref[u] = c
            if c == 0:
                lru[u] = None
                self.pinned_blocks -= ub

    def insert_owned(self, units: Sequence[int]) -> int:
        """A request finished computing these full units: turn its own blocks into cached, pinned units.

        Units already cached (another request computed the same prefix meanwhile)
        are only pinned; the request's duplicate blocks go back to the free pool.
        Returns how many of the request's own blocks were consumed (moved or freed),
        i.e. unit_blocks × len(units); the caller lowers its own-block count by it.
        """
        ref = self._ref
        lru = self._lru
        ub = self.unit_blocks
        for u in units:
            c = ref.get(u)
            if c is None:
                ref[u] = 1
                self.cached_blocks += ub
                self.pinned_blocks += ub
            else:
                if c == 0:
                    del lru[u]
                    self.pinned_blocks += ub
                ref[u] = c + 1
                self.free_blocks += ub  # duplicate content: the request's copy is freed
        return ub * len(units)

    def check(self) -> None:
        """Invariants (tests): block counts add up and never go negative."""
        assert self.free_blocks >= 0, self.free_blocks
        assert 0 <= self.pinned_blocks <= self.cached_blocks, (self.pinned_blocks, self.cached_blocks)
        assert self.cached_blocks == self.unit_blocks * len(self._ref)
        assert self.free_blocks + self.cached_blocks <= self.total_blocks
        assert sum(1 for c in self._ref.values() if c == 0) == len(self._lru)
