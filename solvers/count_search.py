"""Island counts improved by local search: the exact reference's layout when its MILP runs out of time.

Classes c = (GPU type, island size) as in `solvers/exact.py`; a layout is every class's number of
prefill and decode islands, n^P_c and n^D_c. With the counts fixed, the reference model is one LP
per phase r ∈ {P, D} over the classes in that role, and the layout's rate is the smaller of the two:

    Λ_r = max Λ
    (1) Σ_c b^r_cj x_cj >= Λ p_j                  ∀ j   capacity of range j
    (2) Σ_j x_cj <= n^r_c                          ∀ c   the class's islands in role r
    (3) optional KV transfer: Σ_j b^r_cj k_j x_cj <= L_c n^r_c   (egress of prefill, ingress of decode)
    Λ(n) = min(Λ_P, Λ_D)

A move changes one or two islands of one GPU type:

- flip: one island to the other role;
- shrink: one island to the next smaller size its role can use, or gone if there is none;
- grow: one island into the type's free GPUs, to the next size up or the largest that fits;
- transfer: one island shrinks a size (or goes), and an island of another class or role of the
  same type grows into what that freed plus the free GPUs, to the next size up or the largest that fits;
- add: a new island of the largest size that fits the type's free GPUs, in either role.

Every move keeps each type within its GPUs and the layout within the $/h budget. The search takes
the best move (steepest ascent) until none raises Λ or its time is up. Λ_r depends only on the
islands in role r, so each phase's rate is cached by them: a move within one role solves one LP.

Why: cut short at thousands of GPUs, the MILP's incumbent and the relaxation's counts made whole
fall far below the optimum (10,008 GPUs of 8 types: 0.68 of it), because the relaxation takes a
sliver of a giant island at that island's rate per GPU. The relaxation's bound stays tight there;
this search turns its counts into a layout close to it (docs/search.md, Scale).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import role_search

if TYPE_CHECKING:
    from solvers.type_options import TypeOptions

Layout = dict[tuple[int, int], int]  # (class index, role 0 prefill / 1 decode) -> islands


class PhaseRates:
    """Λ_r of a phase's islands, each LP solved once (GLOP)."""

    def __init__(self, types: Sequence[TypeOptions], classes: Sequence[tuple[int, int]], p: np.ndarray,
                 kv_gb: np.ndarray | None) -> None:  # fmt: skip
        self.types, self.classes, self.p, self.kv_gb = types, classes, p, kv_gb
        self._cache: dict[tuple[int, tuple[tuple[int, int], ...]], float] = {}

    def rows(self, c: int, r: int) -> np.ndarray:
        ti, si = self.classes[c]
        return (self.types[ti].prefill_req_s if r == 0 else self.types[ti].decode_req_s)[si]

    def phase(self, r: int, islands: tuple[tuple[int, int], ...]) -> float:
        key = (r, islands)
        if key not in self._cache:
            self._cache[key] = self._solve(r, islands)
        return self._cache[key]

    def rate(self, layout: Layout) -> float:
        return min(self.phase(r, tuple(sorted((c, n) for (c, rr), n in layout.items() if rr == r and n > 0)))
                   for r in (0, 1))  # fmt: skip

    def _solve(self, r: int, islands: tuple[tuple[int, int], ...]) -> float:
        if not islands:
            return 0.0
        b = np.array([self.rows(c, r) for c, _ in islands])  # (k, J)
        n = np.array([float(m) for _, m in islands])
        link = np.array([float(self.types[self.classes[c][0]].sizes[self.classes[c][1]])
                         * self.types[self.classes[c][0]].link_gb_s_per_gpu for c, _ in islands])  # fmt: skip
        return solve_lp(role_search.phase_model(b, self.p, n, self.kv_gb, link))  # (1)-(3)


def solve_lp(model: mb.Model, backends: Sequence[str] = ("glop", "highs")) -> float:
    """The optimum of a phase LP (Λ = 0 is always feasible and capacity bounds Λ, so it has one): GLOP first, and
    where GLOP gives up on a badly scaled phase (ABNORMAL, as it does on some), the next backend."""
    codes = []
    for name in backends:
        solver = mb.Solver(name)
        if not solver.solver_is_supported():
            codes.append(f"{name}: not in this OR-Tools build")
            continue
        solver.enable_output(False)
        if name == "highs":  # HiGHS prints its banner otherwise
            solver.set_solver_specific_parameters("output_flag=false")
        code = solver.solve(model)
        if code.name == "OPTIMAL":
            return float(solver.objective_value)
        codes.append(f"{name}: {code.name}")
    raise RuntimeError(f"count search: a phase LP ended without an optimum ({'; '.join(codes)})")


def neighbours(types: Sequence[TypeOptions], classes: Sequence[tuple[int, int]], layout: Layout,
               budget: float | None) -> Iterator[Layout]:  # fmt: skip
    """Every move of the module docstring from `layout`, each as the layout it leads to."""
    spent = sum(_cost(types, classes, c) * n for (c, _), n in layout.items())
    for ti, t in enumerate(types):
        size = {c: int(t.sizes[si]) for c, (tj, si) in enumerate(classes) if tj == ti}
        usable = {r: [c for c in size if (t.prefill_req_s if r == 0 else t.decode_req_s)[classes[c][1]].any()]
                  for r in (0, 1)}  # fmt: skip
        held = [(c, r) for (c, r), n in layout.items() if n > 0 and c in size]
        free = t.count - sum(size[c] * layout[(c, r)] for c, r in held)
        room = free if budget is None else min(free, (budget - spent) / max(t.price_per_gpu_hour, 1e-12))
        for minus, plus in _moves(size, usable, held, free):
            gpus = sum(size[c] for c, _ in plus) - sum(size[c] for c, _ in minus)
            if gpus > room + 1e-9:
                continue
            out = dict(layout)
            for k in minus:
                out[k] -= 1
            for k in plus:
                out[k] = out.get(k, 0) + 1
            out = {k: n for k, n in out.items() if n > 0}
            if out != layout:  # a transfer that swaps two sizes changes nothing
                yield out


Move = tuple[list[tuple[int, int]], list[tuple[int, int]]]  # islands (class, role) out, islands in


def _moves(size: dict[int, int], usable: dict[int, list[int]], held: list[tuple[int, int]], free: int) -> list[Move]:
    """One GPU type's moves: `size` of each of its classes, the classes each role can use, the
    (class, role) pairs it holds islands of, and its free GPUs."""

    def sized(r: int, low: int, high: int) -> list[int]:
        return [c for c in usable[r] if low < size[c] <= high]

    def ends(cs: list[int]) -> list[int]:  # the next size up and the largest that fits
        return sorted({min(cs, key=size.__getitem__), max(cs, key=size.__getitem__)}) if cs else []

    out: list[Move] = []
    for c, r in held:
        if c in usable[1 - r]:
            out.append(([(c, r)], [(c, 1 - r)]))  # flip
        smaller = sized(r, 0, size[c] - 1)
        down = max(smaller, key=size.__getitem__) if smaller else None
        kept = [] if down is None else [(down, r)]
        out.append(([(c, r)], kept))  # shrink
        out += [([(c, r)], [(to, r)]) for to in ends(sized(r, size[c], size[c] + free))]  # grow
        freed = free + size[c] - (0 if down is None else size[down])
        for c2, r2 in held:
            if (c2, r2) != (c, r):  # transfer
                out += [([(c, r), (c2, r2)], [(to, r2), *kept]) for to in ends(sized(r2, size[c2], size[c2] + freed))]
    for r in (0, 1):
        fit = sized(r, 0, free)
        if fit:
            out.append(([], [(max(fit, key=size.__getitem__), r)]))  # add
    return out


def improve(
    types: Sequence[TypeOptions],
    classes: Sequence[tuple[int, int]],
    p: np.ndarray,
    counts: Sequence[tuple[float, float]],
    *,
    kv_gb: np.ndarray | None = None,
    budget: float | None = None,
    time_limit_s: float = 10.0,
    rates: PhaseRates | None = None,
) -> tuple[float, list[tuple[float, float]]]:
    """(Λ, every class's (n^P, n^D)) at the end of the search from whole `counts` (in `classes` order).

    `counts` must fit every type's GPUs and the budget; the result does too, and its Λ is at least
    that of `counts`. `rates` shares the phase LPs' cache between searches of one instance."""
    rates = rates or PhaseRates(types, classes, p, kv_gb)
    layout = {(c, r): round(n[r]) for c, n in enumerate(counts) for r in (0, 1) if round(n[r]) > 0}
    best = rates.rate(layout)
    deadline = time.perf_counter() + time_limit_s
    while time.perf_counter() < deadline:
        step: tuple[float, Layout] | None = None
        for new in neighbours(types, classes, layout, budget):
            v = rates.rate(new)
            if v > best * (1 + 1e-9) and (step is None or v > step[0]):
                step = (v, new)
            if time.perf_counter() > deadline:
                break
        if step is None:
            break
        best, layout = step
    return best, [(float(layout.get((c, 0), 0)), float(layout.get((c, 1), 0))) for c in range(len(classes))]


def _cost(types: Sequence[TypeOptions], classes: Sequence[tuple[int, int]], c: int) -> float:
    ti, si = classes[c]
    return float(types[ti].sizes[si]) * types[ti].price_per_gpu_hour
