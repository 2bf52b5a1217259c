"""NVIDIA's AIConfigurator (PyPI `aiconfigurator`) driven by one JSON job on stdin, its answer as JSON on stdout.

    .venv-peer/bin/python benchmarks/peer_aic.py < job.json > answer.json

Run by AIConfigurator's own interpreter (benchmarks/requirements-peer.txt pins the version), never the project's: it
imports nothing of Archipelago, so benchmarks/peer_bench.py runs it as a subprocess. Jobs:

- `{"kind": "about"}`: the installed version and the systems, backends and database versions it has data for
  (and the version it uses by default).
- `{"kind": "check", "configs": [...]}`: per configuration (as for `estimate`) the reason AIC cannot express it,
  or null, without estimating.
- `{"kind": "estimate", "configs": [...]}`: one single-point estimate (`aiconfigurator.cli.api.cli_estimate`) per
  configuration, described in InferenceX's terms: `gpu` (h200, b200, ...), `framework` (sglang, trt,
  dynamo-sglang, ...), `precision` (fp8, fp4), `mtp` (null or {"drafts", "accepted"}), `isl`, `osl`, `conc`
  (requests in flight), `disagg`, and per phase (`engine` when aggregated; `prefill` and `decode` with `workers`
  when disaggregated) `gpus` (one worker's), `attention_tp` and `moe_ep`. The answer per configuration is AIC's
  TTFT and TPOT (ms), requests/s and its own tokens/s/GPU, or `reason`: why AIC cannot express or refuses it.
- `{"kind": "plan", "gpu": "h200", "gpus": 32, "precision": "fp8", "isl": 1024, "osl": 1024, "ttft_ms": 2000,
  "tpot_ms": 50, "backend": "trtllm"}`: AIC's own search for the best configuration on that many GPUs
  (`cli_default`, the `aiconfigurator cli default` mode: aggregated and disaggregated swept, the best within
  the TTFT and TPOT limits by tokens/s/GPU), its wall time, and its chosen configuration.

How a configuration is put to AIC:
- GPU and framework through AIC's own InferenceX mapping (aiconfigurator.sdk.config_adapter.inferencex:
  HARDWARE_TO_SYSTEM, FRAMEWORK_TO_BACKEND), at the backend's database version AIC resolves by default;
- the checkpoint whose config AIC ships, quantisation inferred from it as AIC does: FP8 rows are
  deepseek-ai/DeepSeek-R1 (block FP8), FP4 rows nvidia/DeepSeek-V3.1-NVFP4 (NVIDIA's NVFP4 recipe, attention
  projections left out, DeepSeek-R1's architecture);
- a worker of `gpus` GPUs as attention TP `attention_tp` x attention DP `gpus / attention_tp`, MoE TP
  `gpus / moe_ep` x EP `moe_ep`; the batch per attention-DP rank is the requests in flight over the ranks (rounded
  up); a disaggregated prefill worker takes one prompt a batch (AIC's InferenceX adapter's default);
- MTP as AIC's speculative profile: `nextn` draft tokens a step, `nextn_accepted` accepted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

CHECKPOINTS = {"fp8": "deepseek-ai/DeepSeek-R1", "fp4": "nvidia/DeepSeek-V3.1-NVFP4"}
PREFILL_BATCH = 1  # prompts a disaggregated prefill worker batches (aiconfigurator's InferenceX adapter default)


def short(text: str) -> str:
    """AIC's message on one line, its data files named from site-packages."""
    import aiconfigurator_core

    site = str(Path(aiconfigurator_core.__file__).parents[1]) + "/"
    return text.strip().replace(site, "").split("\n")[0][:300]


class Notes(logging.Handler):
    """AIC's warnings while a job runs, each distinct message counted (they say where its data falls back)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[short(record.getMessage())] += 1


def about() -> dict[str, Any]:
    from importlib.metadata import version

    from aiconfigurator_core.sdk.perf_database import get_latest_database_version

    systems = {s: {b: {"versions": v, "default": get_latest_database_version(system=s, backend=b)}
                   for b, v in backends.items()} for s, backends in databases().items()}  # fmt: skip
    return {"version": version("aiconfigurator"), "core_version": version("aiconfigurator-core"), "systems": systems}


@functools.cache
def databases() -> dict[str, dict[str, list[str]]]:
    """AIC's systems, each backend's database versions (read from its data folders: once)."""
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    return {s: dict(b) for s, b in get_supported_databases().items()}


def target(gpu: str, framework: str | None, precision: str) -> tuple[str, str | None, str] | str:
    """(AIC system, backend, checkpoint) of an InferenceX GPU, framework and precision, or why there is none."""
    from aiconfigurator.sdk.config_adapter.inferencex import FRAMEWORK_TO_BACKEND, HARDWARE_TO_SYSTEM

    system = HARDWARE_TO_SYSTEM.get(gpu)
    if system is None or system not in databases():
        return f"no AIConfigurator system for GPU {gpu}"
    backend = None
    if framework is not None:
        backend = FRAMEWORK_TO_BACKEND.get(framework)
        if backend is None:
            return f"framework {framework} is not one AIConfigurator models (trtllm, sglang, vllm)"
        if backend not in databases()[system]:
            return f"no {backend} data for {system}"
    if precision not in CHECKPOINTS:
        return f"precision {precision} has no DeepSeek checkpoint in AIConfigurator"
    return system, backend, CHECKPOINTS[precision]


def worker(phase: dict[str, Any]) -> dict[str, int]:
    """AIC's parallelism of one worker: attention TP x DP, MoE TP x EP, all over the worker's GPUs."""
    gpus, tp, ep = phase["gpus"], phase["attention_tp"], phase["moe_ep"]
    if gpus % tp or gpus % ep:
        raise ValueError(f"attention TP {tp} and MoE EP {ep} must divide the worker's {gpus} GPUs")
    return {"tp_size": tp, "attention_dp_size": gpus // tp, "moe_tp_size": gpus // ep, "moe_ep_size": ep}


def check(cfg: dict[str, Any]) -> str | None:
    """Why AIC cannot express the configuration (None: it can)."""
    got = target(cfg["gpu"], cfg["framework"], cfg["precision"])
    if isinstance(got, str):
        return got
    try:
        for phase in ("prefill", "decode") if cfg["disagg"] else ("engine",):
            worker(cfg[phase])
    except ValueError as err:
        return str(err)
    return None


def estimate(cfg: dict[str, Any]) -> dict[str, Any]:
    """One configuration's estimate, or the reason AIC cannot give one."""
    from aiconfigurator.cli.api import cli_estimate

    why = check(cfg)
    if why is not None:
        return {"id": cfg["id"], "reason": why}
    system, backend, checkpoint = target(cfg["gpu"], cfg["framework"], cfg["precision"])  # type: ignore[misc]
    kw: dict[str, Any] = {"backend_name": backend, "isl": cfg["isl"], "osl": cfg["osl"]}
    if cfg.get("mtp"):
        kw.update(nextn=cfg["mtp"]["drafts"], nextn_accepted=cfg["mtp"]["accepted"])
    t0 = time.perf_counter()
    try:
        if cfg["disagg"]:
            p, d = worker(cfg["prefill"]), worker(cfg["decode"])
            ranks = cfg["decode"]["workers"] * d["attention_dp_size"]
            kw.update(mode="disagg", prefill_batch_size=PREFILL_BATCH, prefill_num_workers=cfg["prefill"]["workers"],
                      decode_batch_size=max(math.ceil(cfg["conc"] / ranks), 1),
                      decode_num_workers=cfg["decode"]["workers"], **{f"prefill_{k}": v for k, v in p.items()},
                      **{f"decode_{k}": v for k, v in d.items()})  # fmt: skip
        else:
            e = worker(cfg["engine"])
            kw.update(mode="agg", batch_size=max(math.ceil(cfg["conc"] / e["attention_dp_size"]), 1), **e)
        r = cli_estimate(checkpoint, system, **kw)
    except Exception as err:  # AIC's refusal (OOM, no data, invalid parallelism) is the answer
        return {"id": cfg["id"], "reason": f"AIC refuses: {type(err).__name__}: {short(str(err))}",
                "seconds": time.perf_counter() - t0}  # fmt: skip
    raw = r.raw
    return {
        "id": cfg["id"],
        "ttft_ms": float(r.ttft),
        "tpot_ms": float(r.tpot),
        "seq_s": float(raw["seq/s"]),
        "tokens_s_gpu": float(raw["tokens/s/gpu"]),
        "num_total_gpus": int(raw["num_total_gpus"]),
        "system": system,
        "backend": f"{backend} {r.backend_version}",
        "quant": {k: str(raw.get(k, raw.get(f"(d){k}", ""))) for k in ("gemm", "moe", "fmha", "kvcache")},
        "kv_warning": r.kv_cache_warning or "",
        "seconds": time.perf_counter() - t0,
    }


def _value(v: Any) -> Any:
    """A DataFrame cell as JSON: numbers as float or int, the rest as text."""
    if isinstance(v, bool):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


AGG_COLUMNS = ("parallel", "bs", "global_bs", "concurrency", "num_total_gpus", "ctx_tokens", "ttft", "tpot",
               "seq/s", "tokens/s/gpu", "tokens/s/gpu_cluster", "tokens/s/user", "gemm", "moe", "fmha", "kvcache",
               "backend", "version", "_sla_exceeded")  # fmt: skip
DISAGG_COLUMNS = ("(p)parallel", "(p)workers", "(p)bs", "(d)parallel", "(d)workers", "(d)bs", "concurrency",
                  "num_total_gpus", "ttft", "tpot", "seq/s", "tokens/s/gpu", "tokens/s/gpu_cluster", "tokens/s/user",
                  "(p)gemm", "(p)moe", "(d)gemm", "(d)moe", "(p)fmha", "(d)kvcache", "(p)backend", "(p)version",
                  "_sla_exceeded")  # fmt: skip


def plan(job: dict[str, Any]) -> dict[str, Any]:
    """AIC's own search (`cli default`) on the job's GPUs, timed."""
    from aiconfigurator.cli.api import cli_default

    got = target(job["gpu"], None, job["precision"])
    if isinstance(got, str):
        return {"reason": got}
    system, _, checkpoint = got
    backend = job.get("backend", "trtllm")
    t0 = time.perf_counter()
    try:
        r = cli_default(checkpoint, job["gpus"], system, backend=backend, isl=job["isl"], osl=job["osl"],
                        ttft=float(job["ttft_ms"]), tpot=float(job["tpot_ms"]), top_n=job.get("top_n", 3))  # fmt: skip
    except Exception as err:  # no feasible configuration is an answer too
        return {"reason": f"{type(err).__name__}: {short(str(err))}",
                "wall_s": time.perf_counter() - t0, "checkpoint": checkpoint, "system": system}  # fmt: skip
    wall = time.perf_counter() - t0
    modes = {}
    for name, df in r.best_configs.items():
        cols = DISAGG_COLUMNS if "(d)parallel" in df.columns else AGG_COLUMNS
        modes[name] = [{c: _value(row[c]) for c in cols if c in df.columns} for _, row in df.iterrows()]
    return {"wall_s": wall, "chosen": r.chosen_exp, "best": {k: float(v) for k, v in r.best_throughputs.items()},
            "configs": modes, "checkpoint": checkpoint, "system": system, "backend": backend}  # fmt: skip


def main() -> None:
    job = json.load(sys.stdin)
    notes = Notes()
    logging.getLogger().addHandler(notes)
    logging.captureWarnings(True)
    warnings.simplefilter("default")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # AIC prints its reports; stdout is the answer alone
        if job["kind"] == "about":
            out: dict[str, Any] = about()
        elif job["kind"] == "check":
            out = {"results": [{"id": c["id"], "reason": check(c)} for c in job["configs"]]}
        elif job["kind"] == "estimate":
            results = []
            for k, cfg in enumerate(job["configs"], 1):
                results.append(estimate(cfg))
                if k % 25 == 0:
                    print(f"[peer_aic] {k}/{len(job['configs'])} estimated", file=sys.stderr, flush=True)
            out = {"results": results}
        elif job["kind"] == "plan":
            out = plan(job)
        else:
            raise SystemExit(f"unknown job kind {job['kind']!r}: about, check, estimate or plan")
    out["notes"] = dict(notes.seen.most_common())
    out["driver_s"] = time.perf_counter() - t0
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
