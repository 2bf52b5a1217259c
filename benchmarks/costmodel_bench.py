"""Cost-model speed, measured side by side in one run (absolute times drift on a shared machine).

    python benchmarks/costmodel_bench.py [--points 100000] [--repeats 20]

1. Points/s of the vectorised decode-step model on 10^5 (GPU, context, batch, tp, ep) points vs
   a plain Python loop calling the same function once per point. Target: >= 100x.
2. Time to build one island's full benchmark (every prefill and decode configuration x 64
   input lengths, decode summed over the mean decode length). Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import decode_step_ms
from costmodel.island_bench import benchmark_island, decode_configs, prefill_configs
from costmodel.specs import GPUArray
from pipeline.planning.workload import make_ranges, synthetic_normal

GPUS = ["H200", "H800", "H20", "DGX-B300", "GB200-NVL72", "MI300X", "A100-80GB", "L40S"]


def points(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "gpu": rng.integers(0, len(GPUS), n),
        "context": rng.integers(1, 16384, n).astype(float),
        "batch": rng.integers(1, 1025, n).astype(float),
        "tp": rng.choice([1, 2, 4, 8], n).astype(float),
        "ep": rng.choice([8, 16, 32, 64, 128, 256], n).astype(float),
    }


def bench_points(n: int) -> None:
    model = load_model("deepseek_v3")
    gpus = [load_gpu(g) for g in GPUS]
    pts = points(n, np.random.default_rng(0))
    table = GPUArray.of(gpus)
    # index the struct-of-arrays by each point's GPU: every field becomes a length-n array
    per_point = GPUArray(
        names=tuple(GPUS[i] for i in pts["gpu"]),
        software=tuple(table.software[i] for i in pts["gpu"]),
        **{f: getattr(table, f)[pts["gpu"]] for f in GPUArray.__dataclass_fields__ if f not in ("names", "software")},
    )
    t0 = time.perf_counter()
    vec = decode_step_ms(per_point, model, pts["context"], pts["batch"], pts["tp"], pts["ep"])
    t_vec = time.perf_counter() - t0

    t0 = time.perf_counter()
    loop = np.empty(n)
    for i in range(n):
        loop[i] = decode_step_ms(
            gpus[pts["gpu"][i]], model, pts["context"][i], pts["batch"][i], pts["tp"][i], pts["ep"][i]
        )
    t_loop = time.perf_counter() - t0

    err = float(np.max(np.abs(vec - loop) / loop))
    print(f"decode step, {n:,} points (8 GPU types, context 1-16k, batch 1-1024, tp, ep)")
    print(f"  vectorised : {t_vec * 1e3:9.1f} ms  {n / t_vec:14,.0f} points/s")
    print(f"  python loop: {t_loop * 1e3:9.1f} ms  {n / t_loop:14,.0f} points/s")
    print(f"  speed-up   : {t_loop / t_vec:9.0f}x   (target >= 100x)   max rel diff {err:.1e}")


def bench_island(repeats: int) -> None:
    model = load_model("deepseek_v3")
    wl = synthetic_normal("fig4_2", 500, 2000, 0, 8000, 100, 1000)
    r = make_ranges(wl, 125)
    print(f"island benchmark, {len(r)} lengths, median of {repeats} builds (decode: Σ over d = 100 steps)")
    for g, n in (("H200", 64), ("H20", 128), ("DGX-B300", 32), ("H800", 16)):
        gpu = load_gpu(g)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            benchmark_island(gpu, n, model, r.mid, r.p, wl.mean_decode, wl.max_decode)
            times.append(time.perf_counter() - t0)
        cfgs = len(prefill_configs(n)) + len(decode_configs(n))
        med = statistics.median(times) * 1e3
        print(f"  {n:4d} x {g:10s} {cfgs:3d} configs x {len(r)} lengths: {med:6.2f} ms  (target <= 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    bench_points(args.points)
    bench_island(args.repeats)


if __name__ == "__main__":
    main()
