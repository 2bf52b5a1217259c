"""Archipelago beside NVIDIA's AIConfigurator (AIC) on the same public measurements: InferenceX's DeepSeek-R1 rows.

    python benchmarks/peer_bench.py [--rows N] [--gpu h200,b200] [--part AB] [--extra costmodel=serving ...]

AIC runs in its own interpreter (`--peer-python`, default .venv-peer/bin/python: `python3 -m venv .venv-peer &&
.venv-peer/bin/pip install -r benchmarks/requirements-peer.txt`), driven by benchmarks/peer_aic.py through JSON on
stdin and stdout.

Part A, errors on the same rows. Each row of conf/measured/inferencex_dsr1.csv (costmodel.measured) is predicted by
both: Archipelago simulates it as benchmarks/inferencex_bench.py does (`simulate`, the cost model of `--extra`'s
overrides); AIC estimates the same configuration (`cli_estimate`): the row's GPU, framework, precision and MTP
(`Row.speculation`: the draft tokens and acceptance Archipelago assumes), each worker's GPUs and attention TP as
Archipelago reads them (costmodel.measured.worker), MoE EP as recorded (EP 1 on a worker wider than its TP: EP over
the worker), `conc` requests in flight, and AIC's fixed lengths at the mean of InferenceX's drawn lengths (uniform
on [0.8 L, L]; `--peer-lengths nominal`: L). AIC's requests/s become InferenceX's per-GPU throughputs with the row's
own GPU counts (input + output over all GPUs; output over the decode GPUs when disaggregated). Printed on the rows
both predict, per GPU type and metric, fitting GPUs (H200, B200, MI300X) and check GPUs apart: rows, the median
|error| (exp(median |ln(predicted / measured)|) - 1) and share within +-15 % of each, side by side, and the median
predicted / measured; then every row either cannot express or refuses, counted by reason. `--rows N` takes N rows
spread evenly over those both can express (deterministic); AIC estimates while Archipelago simulates (two
processes).

Part B, planning the same case: 32 H200 and 16 B200, each at ISL/OSL 1024/1024 and 8192/1024, within
conf/slo/default.yaml's TTFT and TPOT limits. Archipelago's planner runs as `python -m pipeline.search
+inventory=h200_32 ...` (fixed lengths, the `--extra` overrides, its records in a temporary folder); AIC's own
search runs as `cli default` on the same GPUs, with the checkpoint of the precision Archipelago's plan prices the
routed experts in (FP8: deepseek-ai/DeepSeek-R1; FP4: nvidia/DeepSeek-V3.1-NVFP4), one after the other, each
timed. Printed per case: each planner's configuration, its promised output tokens/s/GPU (over all the case's
GPUs), its latencies, and its wall time; the best measured InferenceX output tokens/s/GPU on that GPU at that
ISL/OSL (over all the row's GPUs) among rows within the limits at the median (and at p99, Archipelago's SLO
percentile), of the plan's precision without MTP and of any kind, each row named; promised / measured; and the
two planners' speed ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from common import ROOT, context
from inferencex_bench import METRICS, WITHIN, Predicted, err, reason, refit_without, simulate

from costmodel.catalog import CONF_DIR
from costmodel.measured import FITTING_GPUS, RANGE_RATIO, Phase, Row, decode_engine, load_inferencex, worker

PEER_PYTHON = str(ROOT / ".venv-peer" / "bin" / "python")
DRIVER = Path(__file__).with_name("peer_aic.py")
# Part B: (InferenceX GPU, conf/inventory, GPUs) x (ISL, OSL)
FLEETS = (("h200", "h200_32", 32), ("b200", "b200_16", 16))
LENGTHS = ((1024, 1024), (8192, 1024))
RANGE_WIDTH = 250  # ranges.width of the plans: one input length, so one range whatever its width


# AIC, through benchmarks/peer_aic.py -------------------------------------------------------------------------


class Peer:
    """One job of benchmarks/peer_aic.py in AIC's interpreter: it starts when made, `answer` waits for it."""

    def __init__(self, python: str, job: dict[str, Any]) -> None:
        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE, stdout=self.out, stderr=self.err)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode())
        self.proc.stdin.close()
        self.wall_s = 0.0

    def answer(self) -> dict[str, Any]:
        code = self.proc.wait()
        self.wall_s = time.perf_counter() - self.t0
        self.out.seek(0)
        self.err.seek(0)
        if code != 0:
            tail = self.err.read().decode(errors="replace").strip().splitlines()[-15:]
            raise SystemExit(f"benchmarks/peer_aic.py failed (exit {code}):\n" + "\n".join(tail))
        return json.loads(self.out.read())


def peer(python: str, job: dict[str, Any]) -> dict[str, Any]:
    return Peer(python, job).answer()


def lengths(row: Row, how: str) -> tuple[int, int]:
    """AIC's fixed input and output lengths for a row: the mean of InferenceX's drawn lengths, or the nominal."""
    if how == "nominal":
        return row.isl, row.osl
    return tuple(round((max(int(n * RANGE_RATIO), 1) + n) / 2) for n in (row.isl, row.osl))  # type: ignore[return-value]


def _phase(phase: Phase, size: int, attention_tp: int) -> dict[str, int]:
    """A worker for AIC: its GPUs, attention TP, and MoE EP (as recorded; EP 1 on a worker wider than its recorded
    TP is InferenceX's TP-1 record of a wide-EP worker: experts over the worker, as Archipelago reads it)."""
    ep = phase.ep if phase.ep > 1 and size % phase.ep == 0 else (size if phase.tp < size else 1)
    return {"gpus": size, "attention_tp": attention_tp, "moe_ep": ep}


def peer_config(k: int, row: Row, how: str) -> dict[str, Any]:
    """Row `k` as benchmarks/peer_aic.py takes a configuration."""
    isl, osl = lengths(row, how)
    drafts, accepted = row.speculation
    cfg: dict[str, Any] = {"id": k, "gpu": row.hardware, "framework": row.framework, "precision": row.precision,
                           "mtp": {"drafts": drafts, "accepted": accepted} if drafts else None, "isl": isl,
                           "osl": osl, "conc": row.conc, "disagg": row.disagg}  # fmt: skip
    if row.disagg:
        for name, phase in (("prefill", row.prefill), ("decode", row.decode)):
            cfg[name] = {**_phase(phase, *worker(phase)), "workers": phase.workers}
    else:
        size, attention_tp, _ = decode_engine(row)
        cfg["engine"] = _phase(row.decode, size, attention_tp)
    return cfg


def peer_metrics(row: Row, got: dict[str, Any], how: str) -> dict[str, float]:
    """AIC's estimate in InferenceX's metrics: seconds, and tokens/s per GPU over the row's own GPUs."""
    isl, osl = lengths(row, how)
    seq_s = got["seq_s"]
    return {
        "median_ttft": got["ttft_ms"] / 1e3,
        "median_tpot": got["tpot_ms"] / 1e3,
        "tput_per_gpu": seq_s * (isl + osl) / row.gpus,
        "output_tput_per_gpu": seq_s * osl / (row.decode.gpus if row.disagg else row.gpus),
    }


# Part A ------------------------------------------------------------------------------------------------------


def part_a(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    rows = load_inferencex()
    if args.gpu:
        rows = [r for r in rows if r.hardware in args.gpu.split(",")]
    configs = {k: peer_config(k, r, args.peer_lengths) for k, r in enumerate(rows) if r.prefill.workers or not r.disagg}
    checks = peer(args.peer_python, {"kind": "check", "configs": list(configs.values())})["results"]
    checked = {c["id"]: c["reason"] for c in checks}
    arch_why = {k: reason(r) for k, r in enumerate(rows)}
    peer_why = {k: checked.get(k, "workers not recorded") for k in range(len(rows))}
    both = [k for k in range(len(rows)) if arch_why[k] is None and peer_why[k] is None]
    chosen = [both[i * len(both) // args.rows] for i in range(args.rows)] if 0 < args.rows < len(both) else both

    print(f"## Part A: {len(rows)} InferenceX DeepSeek-R1 rows; Archipelago expresses "
          f"{sum(w is None for w in arch_why.values())}, AIConfigurator {sum(w is None for w in peer_why.values())}, "
          f"both {len(both)}; predicted by both: {len(chosen)}")  # fmt: skip
    print(f"AIC lengths: {args.peer_lengths} of InferenceX's drawn lengths; Archipelago cost-model overrides: "
          f"{' '.join(args.extra) or 'none'}")  # fmt: skip

    job = Peer(args.peer_python, {"kind": "estimate", "configs": [configs[k] for k in chosen]})
    _, ctx = context(["+inventory=tiny_homo", *args.extra])
    model, cost = ctx.planner.model, ctx.planner.cost
    t_arch = time.perf_counter()
    costs = {gpu: cost for gpu in {rows[k].hardware for k in chosen}}
    if args.leave_gpu_out:  # a fitting GPU's rows under the fit without them, as inferencex_bench --leave-gpu-out
        for gpu in set(costs) & set(FITTING_GPUS):
            costs[gpu] = dataclasses.replace(cost, profile=cost.profile.calibrated(refit_without(gpu)))
    arch = {k: simulate(rows[k], model, costs[rows[k].hardware]) for k in chosen}
    arch_s = time.perf_counter() - t_arch
    answer = job.answer()
    aic: dict[int, Predicted] = {}
    for got in answer["results"]:
        row = rows[got["id"]]
        if "reason" in got:
            aic[got["id"]] = Predicted(row, {}, got.get("seconds", 0.0), got["reason"])
        else:
            aic[got["id"]] = Predicted(row, peer_metrics(row, got, args.peer_lengths), got["seconds"])
    compared = [k for k in chosen if not arch[k].refused and not aic[k].refused]
    pairs = [(arch[k], aic[k]) for k in compared]

    fitting = [p for p in pairs if p[0].row.fitting]
    check = [p for p in pairs if not p[0].row.fitting]
    held = "Archipelago: each GPU fitted without its own rows" if args.leave_gpu_out else "Archipelago: in sample"
    side_by_side(fitting, f"Fitting GPUs ({', '.join(g.upper() for g in FITTING_GPUS)}; {held})")
    side_by_side(check, "Check GPUs (never fitted)")
    by_kind(pairs)

    print(f"\n### Rows a side cannot express (of all {len(rows)}) or refuses (of the {len(chosen)} tried)\n")
    for name, why, tried, says in (("Archipelago", arch_why, arch, "refuses: "), ("AIConfigurator", peer_why, aic, "")):
        cannot = Counter(w for w in why.values() if w)
        refuses = Counter(says + p.refused for p in tried.values() if p.refused)
        print(f"- {name} cannot express {sum(cannot.values())} rows and refuses {sum(refuses.values())}")
        for w, n in [*cannot.most_common(), *refuses.most_common()]:
            print(f"  - {n} x {w}")
    kv = {g["id"]: g.get("kv_warning") for g in answer["results"]}
    warned = [aic[k] for k in compared if kv[k]]
    if warned:
        print(f"- AIC estimated {len(warned)} compared rows with its KV-cache warning (the batch over its KV capacity; "
              f"kept): {', '.join(p.row.key for p in warned[:6])}{' ...' if len(warned) > 6 else ''}")  # fmt: skip
    notes(answer)
    done = [g for g in answer["results"] if "seconds" in g]
    print(f"\nArchipelago simulated {len(chosen)} rows in {arch_s:.1f} s; AIC estimated {len(done)} in "
          f"{sum(g['seconds'] for g in done):.1f} s (its process {job.wall_s:.1f} s, beside the simulation on the "
          f"same cores); {time.perf_counter() - t0:.1f} s in all")  # fmt: skip


def _cells(group: list[tuple[Predicted, Predicted]], metric: str) -> list[str] | None:
    """Median |error|, share within 15 % and median predicted / measured of each side, on rows both predict."""
    es = [np.array([x for x in (err(p, metric) for p in side) if x is not None]) for side in zip(*group, strict=True)]
    if not group or any(len(e) != len(es[0]) or not len(e) for e in es):
        return None
    return [str(len(es[0])),
            *(f"{100 * (math.exp(np.median(np.abs(e))) - 1):.0f} %" for e in es),
            *(f"{100 * np.mean(np.abs(e) <= WITHIN):.0f} %" for e in es),
            *(f"{math.exp(np.median(e)):.2f}" for e in es)]  # fmt: skip


def side_by_side(pairs: list[tuple[Predicted, Predicted]], title: str) -> None:
    print(f"\n### {title}: {len(pairs)} rows both predict\n")
    if not pairs:
        return
    print("| GPU | metric | rows | median abs error: Archipelago | AIC | within 15 %: Archipelago | AIC "
          "| pred / meas: Archipelago | AIC |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    groups: dict[str, list[tuple[Predicted, Predicted]]] = defaultdict(list)
    for p in pairs:
        groups[p[0].row.hardware].append(p)
    for gpu in [*sorted(groups), "all"]:
        group = pairs if gpu == "all" else groups[gpu]
        for metric in METRICS:
            cells = _cells(group, metric)
            if cells:
                print(f"| {gpu} | {metric} | {' | '.join(cells)} |")


def by_kind(pairs: list[tuple[Predicted, Predicted]]) -> None:
    print("\n### Every compared row by kind: median abs error, Archipelago / AIC\n")
    print("| engines | precision | speculation | rows | median_tpot | median_ttft | tput_per_gpu |")
    print("|---|---|---|---:|---:|---:|---:|")
    kinds: dict[tuple[str, str, str], list[tuple[Predicted, Predicted]]] = defaultdict(list)
    for p in pairs:
        r = p[0].row
        kinds[("disaggregated" if r.disagg else "aggregated", r.precision, r.spec_method)].append(p)
    for kind, group in sorted(kinds.items()):
        cells = []
        for metric in ("median_tpot", "median_ttft", "tput_per_gpu"):
            c = _cells(group, metric)
            cells.append(f"{c[1]} / {c[2]}" if c else "-")
        print(f"| {' | '.join(kind)} | {len(group)} | {' | '.join(cells)} |")


def notes(answer: dict[str, Any], most: int = 6) -> None:
    """AIC's own warnings while it ran, the most frequent first."""
    seen = answer.get("notes", {})
    if seen:
        print(f"- AIC warned {sum(seen.values())} times ({len(seen)} distinct), most often:")
        for text, n in list(seen.items())[:most]:
            print(f"  - {n} x {text[:220]}")


# Part B ------------------------------------------------------------------------------------------------------


def limits() -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of conf/slo/default.yaml, the limits both planners plan within."""
    slo = yaml.safe_load((CONF_DIR / "slo" / "default.yaml").read_text())
    return float(slo["ttft_ms"]), float(slo["tpot_ms"])


def archipelago_plan(inventory: str, isl: int, osl: int, extra: list[str], out: Path) -> tuple[Any, float, str]:
    """(plan.json's mapping or the reason there is no plan, wall seconds, the command) of Archipelago's planner on
    the case. plan.json is read as the planner wrote it (its schema: plan/schema.py), not re-validated here, so a
    plan written by the checkout as it is when the planner runs is read whatever this process imported earlier."""
    cmd = [sys.executable, "-m", "pipeline.search", f"+inventory={inventory}", "slo=default",
           "workload=synthetic_fig4_2", "workload.dist=empirical", f"+workload.lengths=[{isl}]",
           "+workload.weights=[1]", f"workload.mean_decode={osl}", f"workload.max_decode={osl}",
           f"ranges.width={RANGE_WIDTH}", f"out_root={out}", f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db",
           # every GPU up, as AIConfigurator plans and InferenceX measured (the search's default keeps the most with
           # its worst host lost: 4 hosts of H200 then run 8-GPU engines only)
           "search.spare_hosts=0", *extra]  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    shown = shlex.join(["python", *cmd[1:]])
    path = out / "latest" / "plan.json"
    if run.returncode != 0 or not path.exists():
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return f"no plan (exit {run.returncode}): {' / '.join(tail)}", wall, shown
    return json.loads(path.read_text()), wall, shown


def serving(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in p["islands"] if i["role"] != "idle"]


def describe_plan(p: dict[str, Any]) -> str:
    """A plan's serving islands, identical ones counted."""
    shapes = Counter(f"{i['role']} {i['size']} x {i['gpu']} tp{i['tp']} dp{i['dp']} ep{i['ep']} batch {i['batch']}"
                     f"/rank ({i['precision']['dense']}, experts {i['precision']['experts']})"
                     for i in serving(p))  # fmt: skip
    return "; ".join(f"{n} x {s}" if n > 1 else s for s, n in shapes.items())


def describe_peer(c: dict[str, Any], gpus: int) -> str:
    """AIC's chosen configuration, replicated over the case's GPUs as AIC counts it (tokens/s/gpu_cluster)."""
    copies = gpus // c["num_total_gpus"]
    if "(d)parallel" in c:
        return (f"disagg {copies} x [prefill {c['(p)workers']} x {c['(p)parallel']} bs {c['(p)bs']} + decode "
                f"{c['(d)workers']} x {c['(d)parallel']} bs {c['(d)bs']}/rank] ({c['(d)gemm']}, experts "
                f"{c['(d)moe']}; {c['(p)backend']} {c['(p)version']})")  # fmt: skip
    return (f"agg {copies} x {c['parallel']} bs {c['bs']}/rank, {c['ctx_tokens']} context tokens a step "
            f"({c['gemm']}, experts {c['moe']}; {c['backend']} {c['version']})")  # fmt: skip


def output_per_gpu(row: Row) -> float | None:
    """A row's output tokens/s per GPU over all its GPUs (a disaggregated row records it per decode GPU)."""
    out = row.metrics.get("output_tput_per_gpu")
    if out is None:
        return None
    return out * row.decode.gpus / row.gpus if row.disagg else out


def best_measured(rows: list[Row], gpu: str, isl: int, osl: int, ttft_s: float, tpot_s: float, *, at: str,
                  precision: str | None) -> tuple[float, Row] | None:  # fmt: skip
    """The highest output tokens/s/GPU of InferenceX on `gpu` at isl/osl within the limits at the percentile `at`
    (median | p99); of `precision` without MTP, or of any kind (None)."""
    fits = [(out, r) for r in rows
            if r.hardware == gpu and r.isl == isl and r.osl == osl
            and (precision is None or (r.precision == precision and r.spec_method == "none"))
            and r.metrics[f"{at}_ttft"] <= ttft_s and r.metrics[f"{at}_tpot"] <= tpot_s
            and (out := output_per_gpu(r)) is not None]  # fmt: skip
    return max(fits, key=lambda x: x[0]) if fits else None


def _ratio(promised: float, best: dict[str, tuple[float, Row] | None]) -> str:
    """promised / the best measured, at the median and at p99 (two table cells)."""
    return " | ".join(f"{promised / b[0]:.2f}" if b else "-" for b in (best["median"], best["p99"]))


def part_b(args: argparse.Namespace) -> None:
    ttft_ms, tpot_ms = limits()
    rows = load_inferencex()
    print(f"\n## Part B: planning within TTFT {ttft_ms:g} ms and TPOT {tpot_ms:g} ms (Archipelago: at p99 of its "
          f"simulated queue, conf/slo/default.yaml; AIC: its estimate), AIC backend {args.peer_backend}")  # fmt: skip
    fleets = [f for f in FLEETS if not args.gpu or f[0] in args.gpu.split(",")]
    totals = {"Archipelago": 0.0, "AIC": 0.0}
    for gpu, inventory, n in fleets:
        for isl, osl in LENGTHS:
            with tempfile.TemporaryDirectory(prefix="peer_bench-") as tmp:
                p, arch_wall, cmd = archipelago_plan(inventory, isl, osl, args.extra, Path(tmp))
            precision = "fp8" if isinstance(p, str) else serving(p)[0]["precision"]["experts"]
            job = {"kind": "plan", "gpu": gpu, "gpus": n, "precision": precision, "isl": isl, "osl": osl,
                   "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "backend": args.peer_backend}  # fmt: skip
            run = Peer(args.peer_python, job)
            got = run.answer()
            totals["Archipelago"] += arch_wall
            totals["AIC"] += run.wall_s
            print(f"\n### {n} {gpu.upper()}, ISL/OSL {isl}/{osl}\n")
            print(f"Archipelago: `{cmd}`")
            print(f"AIC: `cli_default({got.get('checkpoint')!r}, {n}, {got.get('system')!r}, backend="
                  f"{args.peer_backend!r}, isl={isl}, osl={osl}, ttft={ttft_ms:g}, tpot={tpot_ms:g})`\n")  # fmt: skip
            print("| planner | configuration | promised output tok/s/GPU | TTFT / TPOT, ms | wall s | "
                  "promised / measured best (median) | (p99) |")  # fmt: skip
            print("|---|---|---:|---:|---:|---:|---:|")
            best = {at: best_measured(rows, gpu, isl, osl, ttft_ms / 1e3, tpot_ms / 1e3, at=at, precision=precision)
                    for at in ("median", "p99")}  # fmt: skip
            if isinstance(p, str):
                print(f"| Archipelago | {p} | - | - | {arch_wall:.1f} | - | - |")
            else:
                promised = p["rates"]["output_tok_s"] / n
                v = p.get("verification")
                lat = f"{v['ttft_ms_at_slo']:.0f} / {v['tpot_ms_at_slo']:.1f} (p99 simulated)" if v else "-"
                print(f"| Archipelago | {describe_plan(p)} | {promised:.0f} | {lat} | {arch_wall:.1f} "
                      f"(search {p['search']['wall_s']:.1f}) | {_ratio(promised, best)} |")  # fmt: skip
            if "reason" in got:
                print(f"| AIC | {got['reason']} | - | - | {run.wall_s:.1f} | - | - |")
            else:
                c = got["configs"][got["chosen"]][0]
                promised = c["tokens/s/gpu_cluster"]
                print(f"| AIC | {describe_peer(c, n)} | {promised:.0f} | {c['ttft']:.0f} / {c['tpot']:.1f} "
                      f"| {run.wall_s:.1f} (search {got['wall_s']:.1f}) | {_ratio(promised, best)} |")  # fmt: skip
                others = {k: v for k, v in got["best"].items() if k != got["chosen"]}
                if others:
                    print("\nAIC's best of the other mode: " + ", ".join(f"{k} {v:.0f} tok/s/GPU"
                                                                          for k, v in others.items()))  # fmt: skip
            print()
            for at in ("median", "p99"):
                for what, prec in ((f"{precision}, no MTP", precision), ("any precision or MTP", None)):
                    found = best_measured(rows, gpu, isl, osl, ttft_ms / 1e3, tpot_ms / 1e3, at=at, precision=prec)
                    text = "no row within the limits"
                    if found:
                        out, r = found
                        text = (f"{out:.0f} tok/s/GPU: {r.key} (line {r.line}; TTFT {r.metrics[f'{at}_ttft']:.2f} s, "
                                f"TPOT {1e3 * r.metrics[f'{at}_tpot']:.1f} ms)")  # fmt: skip
                    print(f"- measured best, {at} within the limits, {what}: {text}")
            if "reason" not in got:
                notes(got, most=3)
            if not isinstance(p, str):
                print(f"- speed: AIC {run.wall_s:.1f} s, Archipelago {arch_wall:.1f} s: Archipelago "
                      f"{run.wall_s / arch_wall:.1f} x as fast")  # fmt: skip
    if fleets:
        a, b = totals["Archipelago"], totals["AIC"]
        print(f"\nAll cases, one after the other on this machine: Archipelago {a:.1f} s, AIC {b:.1f} s "
              f"(AIC / Archipelago = {b / a:.1f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=0, help="Part A: this many rows both can express (0: all)")
    ap.add_argument("--gpu", default="", help="only these InferenceX GPUs, e.g. h200,b200 (both parts)")
    ap.add_argument("--part", default="AB", help="A (errors on the rows), B (planning), or AB")
    ap.add_argument("--extra", nargs="*", default=["costmodel=serving"],
                    help="Archipelago's cost-model overrides, for the simulation and the planner")  # fmt: skip
    ap.add_argument("--peer-python", default=PEER_PYTHON, help="the interpreter AIC is installed in")
    ap.add_argument("--leave-gpu-out", action="store_true",
                    help="Part A: each fitting GPU's rows under a fit without them")  # fmt: skip
    ap.add_argument("--peer-lengths", choices=("mean", "nominal"), default="mean",
                    help="Part A: AIC's fixed lengths, the mean of InferenceX's drawn ones or the nominal")  # fmt: skip
    ap.add_argument("--peer-backend", default="trtllm", help="Part B: AIC's backend (trtllm, sglang, vllm, auto)")
    args = ap.parse_args()
    git = [subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout for cmd in
           (["rev-parse", "--short", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])]  # fmt: skip
    changed = len(git[1].splitlines())
    print(f"Archipelago at {git[0].strip() or '?'}" + (f", {changed} files changed, not committed" if changed else ""))
    about = peer(args.peer_python, {"kind": "about"})
    print(f"AIConfigurator {about['version']} (core {about['core_version']}); its systems (backend: the database "
          "version it uses by default, of those it has):")  # fmt: skip
    for system, backends in sorted(about["systems"].items()):
        print(f"- {system}: " + "; ".join(f"{b} {v['default']} (of {', '.join(v['versions'])})"
                                          for b, v in sorted(backends.items())))  # fmt: skip
    if "A" in args.part.upper():
        part_a(args)
    if "B" in args.part.upper():
        part_b(args)


if __name__ == "__main__":
    main()
