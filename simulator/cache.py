"""Prefix caches: the KV blocks of earlier prompts an engine keeps, so a prompt that starts with them prefills only
the rest (SGLang's radix cache, vLLM's prefix caching).

A prompt is a chain of blocks of `block_tokens` tokens, each named by an id that stands for the block's content and
every block before it (Mooncake's released traces hash 512-token blocks this way; `PrefixBlocks`). A prompt's cached
prefix is its longest run of leading blocks the cache holds. After a prefill the cache holds every block of the
prompt. When it is over its capacity it evicts the least recently used block, leaves first: a prompt's blocks are
touched last to first, so a shared head (a system prompt, a conversation's first turns) outlives the tails that
hang from it, as a radix tree evicts its least recently used leaves.

The cache holds what the engine's KV memory holds beside its running batch: its capacity is set by the engine and
can shrink (an aggregated engine's running requests take memory from it) or grow as the batch changes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixBlocks:
    """Every request's block ids, concatenated (`ids`), request i's at `ids[start[i]:start[i + 1]]`."""

    ids: np.ndarray  # int64
    start: np.ndarray  # int64, len(requests) + 1, non-decreasing, start[0] == 0
    block_tokens: int

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"a prefix block must hold at least one token, got block_tokens={self.block_tokens}")
        s = self.start
        if len(s) < 1 or s[0] != 0 or s[-1] != len(self.ids) or (np.diff(s) < 0).any():
            raise ValueError("`start` must run from 0 to len(ids), non-decreasing, one entry per request and one more")

    def __len__(self) -> int:
        return len(self.start) - 1

    def of(self, i: int) -> np.ndarray:
        return self.ids[self.start[i]:self.start[i + 1]]

    def take(self, idx: np.ndarray) -> PrefixBlocks:
        """The blocks of requests `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        lo, hi = self.start[idx], self.start[idx + 1]
        n = hi - lo
        start = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        pos = np.repeat(lo - start[:-1], n) + np.arange(int(start[-1]))
        return PrefixBlocks(self.ids[pos], start, self.block_tokens)

    @staticmethod
    def of_lists(blocks: list[list[int]] | list[np.ndarray], block_tokens: int) -> PrefixBlocks:
        n = np.array([len(b) for b in blocks], dtype=np.int64)
        ids = np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks]) if len(blocks) else np.zeros(0, np.int64)
        return PrefixBlocks(ids.astype(np.int64), np.concatenate([[0], np.cumsum(n)]).astype(np.int64), block_tokens)


class PrefixCache:
    """An LRU cache of prefix blocks of `capacity` blocks (module docstring), and optionally a host tier of
    `host_capacity` blocks below it (SGLang's hierarchical cache): a block evicted from GPU memory moves there, the
    most recent of the tier, and leaves the cache only when the host tier evicts it too; a prompt that uses it loads
    it back (`on_host` says how many of its blocks come that way)."""

    def __init__(self, capacity: int, host_capacity: int = 0) -> None:
        self.capacity = max(int(capacity), 0)
        self.host_capacity = max(int(host_capacity), 0)
        self.blocks: OrderedDict[int, None] = OrderedDict()  # in GPU memory, least recently used first
        self.host: OrderedDict[int, None] = OrderedDict()  # in host memory, least recently used first
        self.evicted = 0  # blocks that left the cache

    def __len__(self) -> int:
        return len(self.blocks) + len(self.host)

    def match(self, ids: np.ndarray) -> int:
        """How many leading blocks of `ids` the cache holds, in either tier (it is not touched: a router may ask)."""
        n = 0
        for b in ids.tolist():
            if b not in self.blocks and b not in self.host:
                break
            n += 1
        return n

    def on_host(self, ids: np.ndarray, matched: int) -> int:
        """How many of the first `matched` blocks of `ids` are in the host tier (to load back before they serve)."""
        return sum(b in self.host for b in ids[:matched].tolist()) if self.host else 0

    def insert(self, ids: np.ndarray) -> None:
        """The prompt's blocks, now computed (or loaded back), become the most recently used in GPU memory, its head
        the most recent of all."""
        if self.capacity == 0 and self.host_capacity == 0:
            return
        for b in reversed(ids.tolist()):
            self.host.pop(b, None)
            self.blocks[b] = None
            self.blocks.move_to_end(b)
        self.resize(self.capacity)

    def resize(self, capacity: int) -> None:
        """Set the GPU tier's capacity (blocks): its least recently used blocks beyond it move to the host tier (or
        leave, without one), and the host tier's beyond its own leave."""
        self.capacity = max(int(capacity), 0)
        while len(self.blocks) > self.capacity:
            b, _ = self.blocks.popitem(last=False)
            if self.host_capacity:
                self.host[b] = None
                self.host.move_to_end(b)
            else:
                self.evicted += 1
        while len(self.host) > self.host_capacity:
            self.host.popitem(last=False)
            self.evicted += 1


@dataclass
class CacheStats:
    """Prompt tokens an engine was asked to prefill and how many of them its cache held."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_tokens: int = 0  # ... of them loaded back from the host tier

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def cached_tokens(matched_blocks: int, block_tokens: int, prompt: int) -> int:
    """The tokens of a `prompt`-token prompt its `matched_blocks` cached blocks save: never the whole prompt (the
    last token is computed again for its logits, as the engines do)."""
    return max(min(matched_blocks * block_tokens, prompt - 1), 0)
