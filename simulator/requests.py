"""The requests of a simulation: what each asks for (arrival, prompt and answer lengths, user, the prompt's prefix
blocks, its session) and, as the simulation runs, what happened to it (engines, first token, finish, preemptions,
tokens its prefill found cached)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.cache import PrefixBlocks


@dataclass
class Requests:
    """Structure of arrays, one entry per request; times in ms, -1 until they happen."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    user: np.ndarray | None = None  # a user id per request (-1: none), for affinity routing
    blocks: PrefixBlocks | None = None  # each prompt's prefix blocks, for prefix caches (None: no reuse known)
    session: np.ndarray | None = None  # each request's session (a conversation's turns share one; None: not known)
    # the requests before this one only warm the engines (a session workload's turns before the window measured:
    # their prefixes are what the first measured turns find); measurements start past it
    warm: int = 0
    prefill_engine: np.ndarray = field(init=False)
    decode_engine: np.ndarray = field(init=False)
    first_token: np.ndarray = field(init=False)
    finish: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)
    cached: np.ndarray = field(init=False)  # prompt tokens its prefill found in a prefix cache

    def __post_init__(self) -> None:
        n = len(self.arrival)
        if not (len(self.input_len) == len(self.output_len) == n):
            raise ValueError("arrival, input_len and output_len must have one entry per request")
        if n and ((self.input_len < 1).any() or (self.output_len < 1).any()):
            raise ValueError("every request needs input_len >= 1 and output_len >= 1")
        if n and (np.diff(self.arrival) < 0).any():
            raise ValueError("arrivals must be sorted by time")
        if self.user is not None and len(self.user) != n:
            raise ValueError("`user` must have one entry per request")
        if self.blocks is not None and len(self.blocks) != n:
            raise ValueError("`blocks` must have one entry per request")
        if self.session is not None and len(self.session) != n:
            raise ValueError("`session` must have one entry per request")
        if not 0 <= self.warm <= n:
            raise ValueError(f"`warm` must count requests 0..{n}, got {self.warm}")
        self.prefill_engine = np.full(n, -1)
        self.decode_engine = np.full(n, -1)
        self.first_token = np.full(n, -1.0)
        self.finish = np.full(n, -1.0)
        self.preemptions = np.zeros(n, dtype=int)
        self.cached = np.zeros(n, dtype=np.int64)

    def take(self, idx: np.ndarray) -> Requests:
        """Requests `idx` (in time order), with fresh outcomes."""
        return Requests(self.arrival[idx], self.input_len[idx], self.output_len[idx],
                        None if self.user is None else self.user[idx],
                        None if self.blocks is None else self.blocks.take(idx),
                        None if self.session is None else self.session[idx])  # fmt: skip
        # (a subset keeps no warm-up count: its requests are measured from its own start)

    def fresh(self) -> Requests:
        """The same requests, nothing happened yet."""
        return Requests(self.arrival, self.input_len, self.output_len, self.user, self.blocks, self.session,
                        self.warm)

    def __len__(self) -> int:
        return len(self.arrival)
