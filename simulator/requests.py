"""The requests of a simulation: what each asks for (arrival, prompt and answer lengths, user) and, as the
simulation runs, what happened to it (engines, first token, finish, preemptions)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Requests:
    """Structure of arrays, one entry per request; times in ms, -1 until they happen."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    user: np.ndarray | None = None  # a user id per request (-1: none), for affinity routing
    prefill_engine: np.ndarray = field(init=False)
    decode_engine: np.ndarray = field(init=False)
    first_token: np.ndarray = field(init=False)
    finish: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)

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
        self.prefill_engine = np.full(n, -1)
        self.decode_engine = np.full(n, -1)
        self.first_token = np.full(n, -1.0)
        self.finish = np.full(n, -1.0)
        self.preemptions = np.zeros(n, dtype=int)

    def __len__(self) -> int:
        return len(self.arrival)
