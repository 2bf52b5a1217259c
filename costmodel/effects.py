"""Measure each cost-model fix alone on a few reference points; print a markdown table.

    python -m costmodel.effects

Columns: the value under `shallowsim`, the relative change when only that one fix is turned on
(shallowsim + fix), and the value under `corrected` (every fix on). Decode points use tp = 1,
where a batch per GPU and per attention-DP rank are the same thing, so both profiles compare
like with like.
"""

from __future__ import annotations

from collections.abc import Callable

from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import decode_step_ms, max_batch, prefill_time_ms
from costmodel.profile import CostProfile
from costmodel.switches import FIX_DOCS

DSV3 = load_model("deepseek_v3")

# (label, function of profile) — the reference rows of spec section 6 and a few more.
POINTS: list[tuple[str, Callable[[CostProfile], float]]] = [
    (
        "prefill H800 S=4096 tp4 dp8 ρ=.563 (row A)",
        lambda p: float(prefill_time_ms(load_gpu("H800"), DSV3, 4096, 4, 8, cache_hit=0.563, profile=p)),
    ),
    (
        "prefill H20 S=1024 tp8 dp8 ρ=0",
        lambda p: float(prefill_time_ms(load_gpu("H20"), DSV3, 1024, 8, 8, cache_hit=0.0, profile=p)),
    ),
    (
        "prefill H800 S=2048 tp1 dp16 ρ=0",
        lambda p: float(prefill_time_ms(load_gpu("H800"), DSV3, 2048, 1, 16, cache_hit=0.0, profile=p)),
    ),
    (
        "prefill H200 S=2048 tp2 dp12 ρ=0",
        lambda p: float(prefill_time_ms(load_gpu("H200"), DSV3, 2048, 2, 12, cache_hit=0.0, profile=p)),
    ),
    (
        "prefill GB200 S=8192 tp4 dp8 ρ=0",
        lambda p: float(prefill_time_ms(load_gpu("GB200-NVL72"), DSV3, 8192, 4, 8, cache_hit=0.0, profile=p)),
    ),
    (
        "decode H800 S=4383 bs64 tp1 ep144 (row B)",
        lambda p: float(decode_step_ms(load_gpu("H800"), DSV3, 4383, 64, 1, 144, profile=p)),
    ),
    (
        "decode H200 S=4383 bs128 tp1 ep16",
        lambda p: float(decode_step_ms(load_gpu("H200"), DSV3, 4383, 128, 1, 16, profile=p)),
    ),
    (
        "decode GB200 S=4383 bs128 tp1 ep72",
        lambda p: float(decode_step_ms(load_gpu("GB200-NVL72"), DSV3, 4383, 128, 1, 72, profile=p)),
    ),
    (
        "decode H20 S=4383 bs62 tp1 ep16",
        lambda p: float(decode_step_ms(load_gpu("H20"), DSV3, 4383, 62, 1, 16, profile=p)),
    ),
    (
        "max batch H800 S+D=5593 tp1 4 routed (row C)",
        lambda p: float(max_batch(load_gpu("H800"), DSV3, 4383, 1210, 1, 4, profile=p)),
    ),
]


def table() -> str:
    ss, corr = CostProfile.shallowsim(), CostProfile.corrected()
    base = [f(ss) for _, f in POINTS]
    short = [label.split(" (")[0] for label, _ in POINTS]
    head = "| fix | " + " | ".join(short) + " |"
    rule = "|---|" + "---:|" * len(POINTS)
    rows = [head, rule, "| **shallowsim** (ms, or sequences) | " + " | ".join(f"{b:.4g}" for b in base) + " |"]
    for fix in FIX_DOCS:
        prof = ss.with_fixes(**{fix: True})
        cells = []
        for b, (_, f) in zip(base, POINTS, strict=True):
            v = f(prof)
            cells.append("0" if abs(v - b) <= 1e-12 * abs(b) else f"{100 * (v - b) / abs(b):+.1f}%")
        rows.append(f"| `{fix}` | " + " | ".join(cells) + " |")
    rows.append("| **corrected** (all fixes) | " + " | ".join(f"{f(corr):.4g}" for _, f in POINTS) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print("Points:")
    for label, _ in POINTS:
        print(f"- {label}")
    print()
    print(table())
