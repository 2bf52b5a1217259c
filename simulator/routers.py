"""Routers: which prefill engine, and later which decode engine, serves a request.

- `plan`: the plan's routing. A request's input length picks its range; an island serving that
  range is drawn with the plan's fraction for it (per phase); the least-loaded engine of that
  island takes the request.
- `round_robin`, `random`: over all engines of the phase, ignoring lengths and load.
- `p2c` (power of two choices): two engines drawn at random, the less loaded one wins.

Load: a prefill engine's waiting prompt tokens; a decode engine's running plus waiting requests.
"""

from __future__ import annotations

import numpy as np

from simulator.core import Router, Simulation


def _prefill_load(sim: Simulation, i: int) -> int:
    return sim.prefill[i].queued_tokens + (1 if sim.prefill[i].batch else 0)


def _decode_load(sim: Simulation, i: int) -> int:
    return sim.decode[i].load


class RoundRobin(Router):
    def __init__(self) -> None:
        self.next = {"prefill": 0, "decode": 0}

    def _pick(self, phase: str, n: int) -> int:
        i = self.next[phase] % n
        self.next[phase] += 1
        return i

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._pick("prefill", len(sim.prefill))

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick("decode", len(sim.decode))


class RandomRouter(Router):
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def prefill(self, sim: Simulation, req: int) -> int:
        return int(self.rng.integers(len(sim.prefill)))

    def decode(self, sim: Simulation, req: int) -> int:
        return int(self.rng.integers(len(sim.decode)))


class PowerOfTwo(Router):
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def _pick(self, n: int, load: object, sim: Simulation) -> int:
        if n == 1:
            return 0
        a, b = self.rng.choice(n, 2, replace=False)
        return int(a) if load(sim, int(a)) <= load(sim, int(b)) else int(b)  # type: ignore[operator]

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._pick(len(sim.prefill), _prefill_load, sim)

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick(len(sim.decode), _decode_load, sim)


class PlanRouter(Router):
    """Route by the plan: per range and phase, islands with the share of traffic the plan gives them."""

    def __init__(
        self,
        range_end: np.ndarray,
        shares: dict[str, np.ndarray],
        engines_of: dict[str, list[list[int]]],
        seed: int = 0,
    ) -> None:
        """`shares[phase]`: (ranges, islands of the phase) fractions; `engines_of[phase][k]`: island k's engines."""
        self.range_end = range_end
        self.cum = {}
        for phase, f in shares.items():
            tot = f.sum(axis=1, keepdims=True)
            if (tot <= 0).any():
                j = int(np.flatnonzero(tot[:, 0] <= 0)[0])
                raise ValueError(
                    f"the plan routes no {phase} traffic for range {j}: every range needs a serving island"
                )
            self.cum[phase] = np.cumsum(f / tot, axis=1)
        self.engines_of = engines_of
        self.rng = np.random.default_rng(seed)

    def _range(self, tokens: int) -> int:
        return min(int(np.searchsorted(self.range_end, tokens, side="right")), len(self.range_end) - 1)

    def _pick(self, sim: Simulation, req: int, phase: str, load: object) -> int:
        cum = self.cum[phase][self._range(int(sim.r.input_len[req]))]
        k = min(int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right")), len(cum) - 1)
        engines = self.engines_of[phase][k]
        return min(engines, key=lambda i: load(sim, i))  # type: ignore[operator]

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._pick(sim, req, "prefill", _prefill_load)

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick(sim, req, "decode", _decode_load)


ROUTERS = ("plan", "round_robin", "random", "p2c")
