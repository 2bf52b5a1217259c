"""Expert placement across the GPUs of an EP group (seeds/004 §III-D; `docs/simulator_policies.md`).

Inputs: A (layers x experts) activation counts, W (experts x experts) traffic between experts of
consecutive layers (W[j, k] = Σ_i E[i, j, k]), g GPUs with m/g experts each.

- `milp`: the paper's model, solved with CP-SAT. x[j, p] = 1 puts expert index j on GPU p in
  every layer (the paper's placement is layer-independent); s[j, k, p] = x[j, p] AND x[k, p];
  minimise α·D + β·Cut, D >= |L_ip − T_i/g| for every layer i and GPU p, Cut = Σ_{j<k}
  (W_jk + W_kj)(1 − Σ_p s_jkp) (W symmetrised: the paper's j < k sum would drop half the
  traffic). Activation counts are scaled to integers for CP-SAT (`scale`).
- `heuristic`: Algorithm 3, per layer: the experts of the affinity set M go to the anchor GPU,
  the rest by descending activation to the least-loaded GPU that still has room (m/g experts
  per GPU; the paper states no capacity, the MILP does).
- `contiguous`: experts 0..m/g-1 on GPU 0 and so on, the usual default, for comparison.

`imbalance(A, placement)`: the mean over layers of (busiest GPU's load) / (mean GPU load), the
factor by which a decode step's routed experts and all-to-all wait for the busiest GPU
(`costmodel.formulas.decode_parts(expert_imbalance=...)`).

    python -m solvers.expert_placement A.npy W.npy --gpus 8 [--method milp|heuristic|contiguous]
    python -m solvers.expert_placement --example DIR --gpus 8   # writes a sample A.csv, W.csv, then places them
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from costmodel.cli import ArgumentParser, UserError, run


@dataclass(frozen=True)
class Placement:
    gpu_of: np.ndarray  # (layers, experts) GPU of expert j in layer i
    method: str
    status: str
    solve_ms: float


def _check(a: np.ndarray, g: int) -> tuple[int, int]:
    if a.ndim != 2 or (a < 0).any() or not np.isfinite(a).all():
        raise ValueError("the activation matrix must be layers x experts, finite and non-negative")
    n, m = a.shape
    if g < 1 or m % g:
        raise ValueError(f"{m} experts do not split evenly over {g} GPUs (m/g experts per GPU)")
    return n, m


def contiguous(a: np.ndarray, g: int) -> Placement:
    n, m = _check(a, g)
    return Placement(np.tile(np.arange(m) // (m // g), (n, 1)), "contiguous", "optimal", 0.0)


def heuristic(a: np.ndarray, g: int, affinity: set[tuple[int, int]] | None = None, anchor: int = 0) -> Placement:
    """Algorithm 3: `affinity` holds (layer, expert) pairs of M, co-located on GPU `anchor`."""
    t0 = time.perf_counter()
    n, m = _check(a, g)
    cap = m // g
    gpu_of = np.full((n, m), -1)
    for i in range(n):
        load, count = np.zeros(g), np.zeros(g, dtype=int)
        anchored = sorted(j for (li, j) in (affinity or set()) if li == i)
        if len(anchored) > cap:
            raise ValueError(f"layer {i}: {len(anchored)} affinity experts exceed the anchor GPU's {cap} slots")
        for j in anchored:
            gpu_of[i, j] = anchor
            load[anchor] += a[i, j]
            count[anchor] += 1
        for j in np.argsort(-a[i], kind="stable"):
            if gpu_of[i, j] >= 0:
                continue
            open_ = np.flatnonzero(count < cap)
            p = int(open_[np.argmin(load[open_])])
            gpu_of[i, j] = p
            load[p] += a[i, j]
            count[p] += 1
    return Placement(gpu_of, "heuristic", "optimal", (time.perf_counter() - t0) * 1e3)


def milp(
    a: np.ndarray,
    w: np.ndarray,
    g: int,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    scale: float = 1000.0,
    time_limit_s: float = 30.0,
    seed: int = 0,
) -> Placement:
    """The paper's MILP (Eqs. 3-12) with CP-SAT; one placement for every layer."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    n, m = _check(a, g)
    if w.shape != (m, m) or (w < 0).any():
        raise ValueError(f"the traffic matrix must be {m} x {m} and non-negative")
    top = max(float(a.max()), float(w.max()), 1e-12)
    ai = np.round(a / top * scale).astype(int)
    wi = np.round((w + w.T) / top * scale).astype(int)  # symmetrised
    model = cp_model.CpModel()
    x = [[model.new_bool_var(f"x{j}_{p}") for p in range(g)] for j in range(m)]
    for j in range(m):
        model.add_exactly_one(x[j])  # (3)
    for p in range(g):
        model.add(sum(x[j][p] for j in range(m)) == m // g)  # (4)
    model.add(x[0][0] == 1)  # GPUs are interchangeable: fix one expert's GPU
    d = model.new_int_var(0, int(ai.sum()), "D")
    for i in range(n):
        total = int(ai[i].sum())
        for p in range(g):
            load_g = sum(int(ai[i, j]) * x[j][p] for j in range(m) if ai[i, j])
            model.add(g * load_g - total <= g * d)  # (8), scaled by g to stay integral
            model.add(total - g * load_g <= g * d)  # (9)
    cut_terms = []
    for j in range(m):
        for k in range(j + 1, m):
            if wi[j, k] <= 0:
                continue
            together = []
            for p in range(g):
                s = model.new_bool_var(f"s{j}_{k}_{p}")
                model.add_implication(s, x[j][p])  # (10)
                model.add_implication(s, x[k][p])
                model.add_bool_or([s, x[j][p].Not(), x[k][p].Not()])
                together.append(s)
            cut_terms.append(int(wi[j, k]) * (1 - sum(together)))
    model.minimize(round(alpha * 1000) * d + round(beta * 1000) * sum(cut_terms))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = seed
    code = solver.solve(model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"expert placement MILP ended with {solver.status_name(code)}")
    col = np.array([next(p for p in range(g) if solver.value(x[j][p])) for j in range(m)])
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    return Placement(np.tile(col, (n, 1)), "milp", status, (time.perf_counter() - t0) * 1e3)


def gpu_loads(a: np.ndarray, placement: Placement, g: int) -> np.ndarray:
    """(layers, GPUs) activation load L_ip."""
    n, _ = a.shape
    loads = np.zeros((n, g))
    for i in range(n):
        np.add.at(loads[i], placement.gpu_of[i], a[i])
    return loads


def imbalance(a: np.ndarray, placement: Placement, g: int) -> float:
    """Mean over layers of max_p L_ip / mean_p L_ip (1 = even); layers without load count as 1."""
    loads = gpu_loads(a, placement, g)
    mean = loads.mean(axis=1)
    ratio = np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    return float(ratio.mean())


def cut(w: np.ndarray, placement: Placement) -> float:
    """Traffic between experts on different GPUs (layer-0 placement, as the MILP's objective counts it)."""
    col = placement.gpu_of[0]
    apart = col[:, None] != col[None, :]
    return float(((w + w.T) * np.triu(apart, 1)).sum())


def synthetic(
    layers: int, experts: int, seed: int = 0, skew: float = 1.1, pairs: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """Activation counts with Zipf-like popularity (a per-layer permutation) and traffic with a few strong pairs."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, experts + 1) ** skew
    a = np.array([rng.permutation(base) for _ in range(layers)]) * 1e5
    a *= rng.uniform(0.8, 1.2, a.shape)
    w = rng.uniform(0, 10, (experts, experts))
    for _ in range(pairs):
        j, k = rng.choice(experts, 2, replace=False)
        w[j, k] += 1e4
    return a, w


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="python -m solvers.expert_placement", description=__doc__.split("\n\n")[0])
    ap.add_argument("activation", nargs="?", help=".npy or .csv, layers x experts")
    ap.add_argument("traffic", nargs="?", help=".npy or .csv, experts x experts")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--example", metavar="DIR", help="write a synthetic sample (A.csv, W.csv) to DIR and place it")
    ap.add_argument("--method", choices=("milp", "heuristic", "contiguous"), default="milp")
    ap.add_argument("--time-limit", type=float, default=30.0)
    args = ap.parse_args(argv)
    if args.example:
        args.activation, args.traffic = write_example(args.example)
        print(f"wrote {args.activation} and {args.traffic}: a synthetic sample (see `write_example`)")
    elif not (args.activation and args.traffic):
        raise UserError("give the activation and traffic matrices (A W), or --example DIR for a sample to try")
    try:
        a, w = (_load_matrix(f) for f in (args.activation, args.traffic))
        _, m = _check(a, args.gpus)
        if w.shape != (m, m) or (w < 0).any() or not np.isfinite(w).all():
            raise ValueError(
                f"{args.traffic}: the traffic matrix must be experts x experts ({m} x {m}, the activation matrix's "
                f"{m} experts), finite and non-negative; got shape {w.shape[0]} x {w.shape[1] if w.ndim > 1 else 1}"
            )
        if args.method == "milp":
            pl = milp(a, w, args.gpus, time_limit_s=args.time_limit)
        elif args.method == "heuristic":
            pl = heuristic(a, args.gpus)
        else:
            pl = contiguous(a, args.gpus)
    except OSError as err:
        raise UserError(f"cannot read {err.filename}: {err.strerror}") from None
    except ValueError as err:
        raise UserError(str(err)) from None
    base = contiguous(a, args.gpus)
    print(
        f"method {pl.method} ({pl.status}, {pl.solve_ms:.0f} ms): imbalance {imbalance(a, pl, args.gpus):.4f} "
        f"(contiguous {imbalance(a, base, args.gpus):.4f}), cut {cut(w, pl):.4g} (contiguous {cut(w, base):.4g})"
    )
    print("expert_imbalance for pipeline.simulate:", round(imbalance(a, pl, args.gpus), 4))
    return 0


def write_example(folder: str, layers: int = 4, experts: int = 32, seed: int = 0) -> tuple[str, str]:
    """`synthetic`'s sample as DIR/A.csv and DIR/W.csv, to try the command on (shapes and skews, not a
    measurement)."""
    from pathlib import Path

    a, w = synthetic(layers, experts, seed)
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
        np.savetxt(out / "A.csv", a.round(), delimiter=",", fmt="%.0f")
        np.savetxt(out / "W.csv", w.round(1), delimiter=",", fmt="%.1f")
    except OSError as err:
        raise UserError(f"--example {folder}: cannot write the sample there ({err.filename}: {err.strerror}); give "
                        "a folder this user can create and write") from None  # fmt: skip
    return str(out / "A.csv"), str(out / "W.csv")


def _load_matrix(path: str) -> np.ndarray:
    """A 2-D matrix from .npy or .csv; ValueError names the file."""
    try:
        out = np.load(path, allow_pickle=False) if path.endswith(".npy") else np.loadtxt(path, delimiter=",", ndmin=2)
    except (ValueError, EOFError) as err:
        raise ValueError(f"{path}: not a numeric .npy or comma-separated .csv matrix ({err})") from None
    out = np.asarray(out, dtype=float)
    if out.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D matrix, got {out.ndim} dimension(s)")
    return out


if __name__ == "__main__":
    run(lambda: main(sys.argv[1:]))
