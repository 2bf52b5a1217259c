"""Measure, on the GPU this runs on, the kernels the cost model prices, as calibration rows.

    python benchmarks/device_kernels.py --gpu H200 --out rows.csv [--log log.json]

Standalone (PyTorch and Triton only, none of this project's packages), for a machine with one NVIDIA Hopper or
Blackwell GPU. It writes rows in the measurement format `costmodel.calibrate` reads
(`component,gpu,shape,value,unit,source`), for the components whose kernels PyTorch itself ships:

- `dense_gemm`: FP8 GEMMs at DeepSeek-V3's projection shapes (the DeepGEMM README's table: m = 64, 128, 4096 tokens),
  through `torch._scaled_mm` (cuBLASLt) with the finest scaling this PyTorch accepts on the GPU (DeepGEMM's 1x128 /
  128x128 blocks where it can, else per row);
- `grouped_gemm`: FP8 expert GEMMs, contiguous (prefill) and masked-size (decode) groups, through
  `torch._scaled_grouped_mm` (per-row scales);
- `attention_prefill`: causal attention at MLA prefill's head dims (128 heads, q/k 192, v 128) in BF16 through
  `scaled_dot_product_attention` (the fastest backend that takes those dims), counted as the cost model counts it
  (2 x heads x causal pairs x (192 + 128));
- the same attention for a prompt whose first tokens are in a prefix cache (`new` tokens over a `context` of cached
  plus new ones, causal from the bottom right: what a cache hit leaves to compute), counted the same way
  (pairs = new x (context - new) + new (new + 1) / 2).

Every kernel's output is checked against a float32 reference before it is timed (a scale layout the kernel misreads
is dropped, not timed). Times are the median of CUDA-event timings with the L2 cache flushed before each
(`triton.testing.do_bench`), so weights stream from HBM as they do between a model's layers. The memory copy
bandwidth and a BF16 8192-cube GEMM are logged as the card's ceilings, not written as rows.

Not measured here, for want of the kernels in PyTorch: MLA decode (FlashMLA), DeepEP's all-to-all, NCCL across
GPUs. Those rows stay the libraries' published tables.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import json
import math
import subprocess
import sys

import torch

FP8 = torch.float8_e4m3fn
# DeepSeek-V3's dense projections (n, k), as in DeepGEMM's README table
DENSE_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DENSE_M = [64, 128, 4096]
# (groups, m per group, n, k, layout): DeepGEMM's grouped tables' shapes (expert up/gate and down projections)
GROUPED = [(4, 8192, 4096, 7168, "contiguous"), (4, 8192, 7168, 2048, "contiguous"),
           (8, 4096, 4096, 7168, "contiguous"), (8, 4096, 7168, 2048, "contiguous"),
           (1, 1024, 4096, 7168, "masked"), (1, 1024, 7168, 2048, "masked"),
           (2, 512, 4096, 7168, "masked"), (2, 512, 7168, 2048, "masked"),
           (4, 256, 4096, 7168, "masked"), (4, 256, 7168, 2048, "masked"),
           (8, 128, 4096, 7168, "masked"), (8, 128, 7168, 2048, "masked"),
           (32, 64, 4096, 7168, "masked"), (32, 64, 7168, 2048, "masked")]
ATTN_SEQ = [(4, 1024), (2, 4096), (1, 8192)]  # (prompts, tokens each)
ATTN_PREFIX = [(4, 256, 4096), (1, 1024, 8192), (1, 1024, 32768), (1, 4096, 32768)]  # (prompts, new, context)
HEADS, D_QK, D_V = 128, 192, 128
TOLERANCE = 3e-2  # relative Frobenius error an FP8 product of exact FP8 inputs stays well inside


def bench_ms(fn) -> float:
    from triton.testing import do_bench  # Triton ships with PyTorch's CUDA builds

    return float(do_bench(fn, warmup=50, rep=200, return_mode="median"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def fp8_pair(m: int, n: int, k: int):
    """A (m x k) and B (n x k) in FP8, exact values, and their float32 copies."""
    a = (torch.randn(m, k, device="cuda") * 2).to(FP8)
    b = (torch.randn(n, k, device="cuda") * 2).to(FP8)
    return a, b, a.float(), b.float()


def block_scales(rows: int, cols: int, br: int, bc: int) -> torch.Tensor:
    return torch.rand(math.ceil(rows / br), math.ceil(cols / bc), device="cuda") + 0.5


def expand(s: torch.Tensor, br: int, bc: int, rows: int, cols: int) -> torch.Tensor:
    return s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]


def dense_recipes(m: int, n: int, k: int):
    """(name, kernel call, reference) for each scaling recipe to try, finest first."""
    a, b, af, bf = fp8_pair(m, n, k)
    sa = block_scales(m, k, 1, 128)  # 1 x 128 blocks of A
    sb = block_scales(n, k, 128, 128)  # 128 x 128 blocks of B (n x k)
    ref_block = (af * expand(sa, 1, 128, m, k)) @ (bf * expand(sb, 128, 128, n, k)).t()
    ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
    ref_row = (af @ bf.t()) * ra * rb
    one = torch.ones((), device="cuda")
    out = []
    # blockwise, scales outer-dim-major as cuBLASLt wants them; two layouts of B's scales
    for label, sbx in ((" (B's scales n-major)", sb), ("", sb.t())):
        for sa_layout in (sa.t().contiguous().t(), sa):
            out.append((f"blockwise 1x128/128x128{label}",
                        lambda sa_=sa_layout, sb_=sbx: torch._scaled_mm(a, b.t(), sa_, sb_, out_dtype=torch.bfloat16),
                        ref_block))
    out.append(("rowwise", lambda: torch._scaled_mm(a, b.t(), ra, rb, out_dtype=torch.bfloat16), ref_row))
    out.append(("tensorwise", lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16), af @ bf.t()))
    return out


def first_working(candidates, log: dict, what: str):
    for name, fn, ref in candidates:
        try:
            err = rel_err(fn(), ref)
        except Exception as exc:  # a recipe this PyTorch or GPU does not take
            log.setdefault("refused", []).append(f"{what} {name}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        if err < TOLERANCE:
            return name, fn, err
        log.setdefault("refused", []).append(f"{what} {name}: wrong result (relative error {err:.3g})")
    return None


def dense_rows(gpu: str, log: dict, source: str) -> list[list]:
    rows = []
    for m in DENSE_M:
        for n, k in DENSE_NK:
            candidates = dense_recipes(m, n, k)
            found = first_working(candidates, log, f"dense m={m} n={n} k={k}")
            if found is None:
                continue
            name, fn, err = found
            ms = bench_ms(fn)
            tflops = 2 * m * n * k / ms / 1e9
            # per-row scaling beside it, logged only: how far the block-scaled kernel is from the plainest FP8 one
            rowwise = next(f for label, f, _ in candidates if label == "rowwise")
            row_ms = bench_ms(rowwise)
            log.setdefault("dense", []).append({"m": m, "n": n, "k": k, "recipe": name, "ms": ms, "err": err,
                                                "TFLOPS": tflops, "rowwise_ms": row_ms})
            rows.append(["dense_gemm", gpu, f"m={m} n={n} k={k}", f"{tflops:.0f}", "TFLOPS",
                         f"{source}; FP8 torch._scaled_mm (cuBLASLt), {name} scaling, {ms * 1e3:.1f} us"])
            print(f"dense m={m:5d} n={n:6d} k={k:6d} {name:34s} {ms * 1e3:9.1f} us {tflops:7.0f} TFLOPS "
                  f"(rowwise {row_ms * 1e3:.1f} us)", flush=True)
    return rows


def grouped_call(groups: int, m: int, n: int, k: int, layout: str):
    a = (torch.randn(groups * m, k, device="cuda") * 2).to(FP8)
    b = (torch.randn(groups, n, k, device="cuda") * 2).to(FP8)  # each expert's weight n x k, row-major
    sa = torch.rand(groups * m, device="cuda") + 0.5
    sb = torch.rand(groups, n, device="cuda") + 0.5
    ref = torch.cat([(a[g * m:(g + 1) * m].float() @ b[g].float().t()) * sa[g * m:(g + 1) * m, None] * sb[g][None]
                     for g in range(groups)])
    if layout == "contiguous":  # tokens of every expert back to back, group ends in `offs`
        offs = torch.arange(1, groups + 1, device="cuda", dtype=torch.int32) * m
        return (lambda: torch._scaled_grouped_mm(a, b.transpose(-2, -1), sa, sb, offs=offs,
                                                 out_dtype=torch.bfloat16)), ref
    a3 = a.view(groups, m, k)  # masked: one padded block of m tokens per expert

    def call():
        return torch._scaled_grouped_mm(a3, b.transpose(-2, -1), sa.view(groups, m), sb,
                                        out_dtype=torch.bfloat16).reshape(groups * m, n)

    return call, ref


def grouped_rows(gpu: str, log: dict, source: str) -> list[list]:
    rows = []
    for groups, m, n, k, layout in GROUPED:
        what = f"grouped groups={groups} m={m} n={n} k={k} {layout}"
        try:
            fn, ref = grouped_call(groups, m, n, k, layout)
            err = rel_err(fn(), ref)
        except Exception as exc:
            log.setdefault("refused", []).append(f"{what}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        if err >= TOLERANCE:
            log.setdefault("refused", []).append(f"{what}: wrong result (relative error {err:.3g})")
            continue
        ms = bench_ms(fn)
        tflops = 2 * groups * m * n * k / ms / 1e9
        log.setdefault("grouped", []).append({"shape": what, "ms": ms, "err": err, "TFLOPS": tflops})
        rows.append(["grouped_gemm", gpu, f"groups={groups} m={m} n={n} k={k} layout={layout}", f"{tflops:.0f}",
                     "TFLOPS", f"{source}; FP8 torch._scaled_grouped_mm, per-row scaling, {ms * 1e3:.1f} us"])
        print(f"{what:58s} {ms * 1e3:9.1f} us {tflops:7.0f} TFLOPS", flush=True)
    return rows


def checked_ms(fn, part, ref, log: dict, what: str) -> float | None:
    """`fn`'s median time, once `part` of its output matches `ref` (None: not checked); None where it fails or is
    wrong (the log's `refused` says which)."""
    try:
        if ref is not None and (err := rel_err(part(fn()), ref)) >= TOLERANCE:
            log.setdefault("refused", []).append(f"{what}: wrong result ({err:.3g})")
            return None
        return bench_ms(fn)
    except Exception as exc:  # a backend this PyTorch or GPU does not take for these shapes
        log.setdefault("refused", []).append(f"{what}: {type(exc).__name__}: {str(exc)[:160]}")
        return None


def fastest(fn, part, ref, pairs: float, log: dict, key: str, shape: dict, label: str):
    """(backend, TFLOPS, ms) of the fastest SDPA backend that runs `fn` right (`checked_ms`), `pairs` query-key pairs
    over all prompts counted as the cost model counts them (2 x heads x pairs x (192 + 128)); each timing logged
    under `key`. None where no backend runs it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    best = None
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip
        with sdpa_kernel([backend]):
            ms = checked_ms(fn, part, ref, log, f"{key.replace('_', ' ')} {name} {label}")
        if ms is None:
            continue
        tflops = 2 * HEADS * pairs * (D_QK + D_V) / ms / 1e9
        log.setdefault(key, []).append({"backend": name, **shape, "ms": ms, "TFLOPS": tflops})
        print(f"{key.replace('_', ' ')} {name:9s} {label} {ms * 1e3:9.1f} us {tflops:7.0f} TFLOPS", flush=True)
        if best is None or tflops > best[1]:
            best = (name, tflops, ms)
    return best


def attention_rows(gpu: str, log: dict, source: str) -> list[list]:
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for batch, seq in ATTN_SEQ:
        q = torch.randn(batch, HEADS, seq, D_QK, device="cuda", dtype=torch.bfloat16)
        kk = torch.randn(batch, HEADS, seq, D_QK, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, HEADS, seq, D_V, device="cuda", dtype=torch.bfloat16)
        ref = None
        if seq <= 4096:  # a float32 reference of the first prompt's first heads
            qf, kf, vf = q[0, :4].float(), kk[0, :4].float(), v[0, :4].float()
            s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D_QK)
            s = s.masked_fill(torch.ones(seq, seq, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
            ref = torch.softmax(s, -1) @ vf
        best = fastest(functools.partial(sdpa, q, kk, v, is_causal=True), lambda o: o[0, :4], ref,
                       batch * seq * (seq + 1) / 2, log, "attention", {"batch": batch, "seq": seq},
                       f"{batch} x {seq:5d}")  # fmt: skip
        if best is not None:
            name, tflops, ms = best
            rows.append(["attention_prefill", gpu, "", f"{tflops:.0f}", "TFLOPS",
                         f"{source}; causal BF16 SDPA ({name} backend), {batch} prompts x {seq} tokens, 128 heads, "
                         f"q/k 192 v 128, {ms * 1e3:.0f} us"])
    return rows


def prefix_attention_rows(gpu: str, log: dict, source: str) -> list[list]:
    """Causal attention of `new` tokens over `context` (the first context - new cached), the mask aligned
    bottom-right as a prefix cache's hit needs; each backend that takes the mask, checked and timed."""
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for batch, new, context in ATTN_PREFIX:
        q = torch.randn(batch, HEADS, new, D_QK, device="cuda", dtype=torch.bfloat16)
        kk = torch.randn(batch, HEADS, context, D_QK, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, HEADS, context, D_V, device="cuda", dtype=torch.bfloat16)
        qf, kf, vf = q[0, :2].float(), kk[0, :2].float(), v[0, :2].float()  # float32 reference, two heads
        s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D_QK)
        rows_i = torch.arange(new, device="cuda")[:, None] + (context - new)
        s = s.masked_fill(torch.arange(context, device="cuda")[None, :] > rows_i, float("-inf"))
        ref = torch.softmax(s, -1) @ vf
        del s
        mask = causal_lower_right(new, context)
        pairs = new * (context - new) + new * (new + 1) / 2
        best = fastest(functools.partial(sdpa, q, kk, v, attn_mask=mask), lambda o: o[0, :2], ref, batch * pairs,
                       log, "prefix_attention", {"batch": batch, "new": new, "context": context},
                       f"{batch} x {new:5d} over {context:6d}")  # fmt: skip
        if best is not None:
            name, tflops, ms = best
            rows.append(["attention_prefill", gpu, f"new={new} context={context}", f"{tflops:.0f}", "TFLOPS",
                         f"{source}; causal BF16 SDPA ({name} backend) with a bottom-right causal mask, {batch} "
                         f"prompts x {new} new tokens over {context}, 128 heads, q/k 192 v 128, {ms * 1e3:.0f} us"])
        del q, kk, v
    return rows


PARTS = {"dense": dense_rows, "grouped": grouped_rows, "attention": attention_rows, "prefix": prefix_attention_rows}


def ceilings(log: dict) -> None:
    x = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    log["copy_TBps"] = 2 * x.numel() / ms / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench_ms(lambda: a @ a)
    log["bf16_8192_TFLOPS"] = 2 * 8192**3 / ms / 1e9
    print(f"copy {log['copy_TBps']:.2f} TB/s (read + write); bf16 8192^3 {log['bf16_8192_TFLOPS']:.0f} TFLOPS",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="the catalogue name of this GPU (conf/gpu), e.g. H200")
    ap.add_argument("--out", required=True, help="CSV of measurement rows")
    ap.add_argument("--log", help="JSON of every timing, the recipes refused and the machine")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)} (default all)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := [p for p in parts if p not in PARTS]:
        print(f"error: --parts {','.join(unknown)}: not a part; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA GPU is visible; run this on the GPU to be measured", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    log = {"device": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": datetime.date.today().isoformat()}
    print(json.dumps(log), flush=True)
    source = (f"measured on one {log['device']} ({smi}), torch {torch.__version__} CUDA {torch.version.cuda}, "
              f"benchmarks/device_kernels.py, {log['date']}, median of CUDA-event timings, L2 flushed")
    ceilings(log)
    rows = []
    for part in (PARTS[p] for p in parts):
        try:
            rows += part(args.gpu, log, source)
        except Exception as exc:  # keep the other parts' rows
            log.setdefault("failed", []).append(f"{part.__name__}: {type(exc).__name__}: {exc}")
        with open(args.out, "w", newline="") as f:  # rewritten after each part: a timeout keeps what was measured
            w = csv.writer(f)
            w.writerow(["component", "gpu", "shape", "value", "unit", "source"])
            w.writerows(rows)
        if args.log:
            with open(args.log, "w") as f:
                json.dump(log, f, indent=1)
    for line in dict.fromkeys(r.split(": ")[0].split(" m=")[0] + ": " + r.split(": ", 1)[1][:90]
                              for r in log.get("refused", []) + log.get("failed", [])):
        print("not measured:", line)
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
