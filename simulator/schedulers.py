"""Engine schedulers: the order in which an engine takes requests from its waiting queue.

The same policy orders a prefill engine's queue (before each batch) and a decode engine's
admission queue (before each step). `docs/simulator_policies.md` gives each source's text.

- `fcfs`: arrival order; a preempted request goes back to the front (vLLM's behaviour).
- `no_preempt` (seed 002, 2.1.2): FCFS, but a decode engine admits a request only when the KV
  of its prompt plus the longest response (`max_output`) can be reserved, so nothing is ever
  preempted.
- `sjf_aging` (seed 004, Algorithm 2): shortest prompt first; a request waiting longer than
  θ_age (default 5 s) is promoted ahead of every other, oldest first among the promoted.
- `larry` (seed 002, Eq. 1, with the sign its prose requires): score = α·waiting seconds −
  queue length · prompt tokens, highest first (α = 1 by default; α → ∞ is FCFS).
- `srpt` (TRAIL+ with c = 0, seed 002, 2.1.5): the oracle that knows output lengths: the least
  remaining work first (prompt tokens in a prefill queue, tokens left to generate in decode).

Waiting time counts from the request's arrival in the system.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from simulator.requests import Requests


class Simulation(Protocol):
    """What a scheduler reads of the running simulation (`simulator.core.Simulation`): the clock (ms), the
    requests, and the tokens a preempted request had generated when it was preempted."""

    now: float
    r: Requests
    progress: dict[int, int]


class Scheduler:
    name = "fcfs"
    preemptive = True  # may a decode engine preempt a running request when memory runs out?

    def order(self, sim: Simulation, queue: list[int], phase: str) -> None:
        """Reorder `queue` (request ids) in place; FCFS leaves it as it is."""

    def reserve(self, sim: Simulation, req: int, context: int) -> int:
        """KV tokens a decode engine sets aside when it admits `req` (its current context by default)."""
        return context


class NoPreempt(Scheduler):
    name = "no_preempt"
    preemptive = False

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output

    def reserve(self, sim: Simulation, req: int, context: int) -> int:
        return int(sim.r.input_len[req]) + self.max_output


class SJFAging(Scheduler):
    name = "sjf_aging"

    def __init__(self, theta_age_ms: float = 5000.0) -> None:
        self.theta = theta_age_ms

    def order(self, sim: Simulation, queue: list[int], phase: str) -> None:
        now, arrival, prompt = sim.now, sim.r.arrival, sim.r.input_len

        def key(r: int) -> tuple[int, float]:
            aged = now - arrival[r] >= self.theta
            return (0, float(arrival[r])) if aged else (1, float(prompt[r]))

        queue.sort(key=key)  # stable: arrival order among equals


class Larry(Scheduler):
    name = "larry"

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha

    def order(self, sim: Simulation, queue: list[int], phase: str) -> None:
        now, arrival, prompt, n = sim.now, sim.r.arrival, sim.r.input_len, len(queue)
        queue.sort(key=lambda r: -(self.alpha * (now - arrival[r]) / 1e3 - n * float(prompt[r])))


class SRPT(Scheduler):
    name = "srpt"

    def order(self, sim: Simulation, queue: list[int], phase: str) -> None:
        if phase == "prefill":
            prompt = sim.r.input_len
            queue.sort(key=lambda r: int(prompt[r]))
        else:
            out, progress = sim.r.output_len, sim.progress
            queue.sort(key=lambda r: int(out[r]) - progress.get(r, 1))


# name -> factory(max_output, theta_age_ms, alpha); a new policy is one class plus one line here, and
# tests/test_contracts.py runs it through the family's contract.
SCHEDULERS: dict[str, Callable[[int, float, float], Scheduler]] = {
    "fcfs": lambda max_output, theta, alpha: Scheduler(),
    "no_preempt": lambda max_output, theta, alpha: NoPreempt(max_output),
    "sjf_aging": lambda max_output, theta, alpha: SJFAging(theta),
    "larry": lambda max_output, theta, alpha: Larry(alpha),
    "srpt": lambda max_output, theta, alpha: SRPT(),
}


def make_scheduler(name: str, *, max_output: int, theta_age_ms: float = 5000.0, alpha: float = 1.0) -> Scheduler:
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler={name!r} is unknown: choose from {list(SCHEDULERS)}")
    return SCHEDULERS[name](max_output, theta_age_ms, alpha)
