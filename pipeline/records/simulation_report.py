"""A simulation's records for a reader (`pipeline.simulate`): metrics tables, TTFT/TPOT CDFs with the SLOs,
KV use over time, and served against offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from costmodel.settings import Slo
from simulator.core import Simulation


def cell(v: Any) -> str:
    """A number as a reader takes it in: thousands separated, no exponent, 3-4 significant digits."""
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    if v != v:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1 or a == 0:
        return f"{v:.2f}"
    return f"{v:.3f}"


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [cell(row[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cdf_plots(sim: Simulation, path: Path, title: str, slo: Slo) -> None:
    """TTFT and TPOT CDFs with each SLO drawn (target: vertical, percentile: horizontal), KV use over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = sim.r
    fig, axs = plt.subplots(1, 3, figsize=(15, 4))
    ttft = np.sort(r.first_token - r.arrival)
    decoded = r.output_len > 1
    tpot = np.sort((r.finish - r.first_token)[decoded] / (r.output_len[decoded] - 1))
    for ax, xs, label, key in ((axs[0], ttft, "TTFT (ms)", "ttft"), (axs[1], tpot, "TPOT (ms)", "tpot")):
        if xs.size:
            ax.plot(xs, np.arange(1, xs.size + 1) / xs.size)
        target, pct = getattr(slo, f"{key}_ms"), getattr(slo, f"{key}_percentile")
        if target is not None:
            ax.axvline(target, color="r", ls="--", lw=1, label=f"SLO: {target:g} ms")
            ax.axhline(pct / 100, color="r", ls=":", lw=1, label=f"p{pct:g}")
            ax.legend(fontsize=8, loc="lower right")
        ax.set(xlabel=label, ylabel="fraction of requests", xscale="log")
    if sim.kv_trace:
        t, u = zip(*sim.kv_trace, strict=True)
        axs[2].plot(np.array(t) / 1e3, u)
    axs[2].set(xlabel="time (s)", ylabel="KV in use / capacity (all decode engines)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def throughput_plot(rows: list[dict[str, Any]], lam: float, best: float, path: Path, title: str) -> None:
    """Served against offered rate, each point marked by whether the SLOs held; the plan's rate and the
    highest sustained rate as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    off = np.array([r["offered_req_s"] for r in rows])
    srv = np.array([r["throughput_req_s"] for r in rows])
    ok = np.array([bool(r["sustained"]) for r in rows])
    top = max(float(off.max()), float(srv.max()), lam) * 1.05
    ax.plot([0, top], [0, top], color="0.7", lw=1, label="served = offered")
    ax.plot(off, srv, color="0.4", lw=1)
    ax.scatter(off[ok], srv[ok], color="g", zorder=3, label="sustained within the SLOs")
    ax.scatter(off[~ok], srv[~ok], color="r", marker="x", zorder=3, label="not sustained")
    ax.axvline(lam, color="b", ls="--", lw=1, label=f"plan's rate {lam:.0f} req/s")
    if best > 0:
        ax.axvline(best, color="g", ls=":", lw=1, label=f"highest sustained {best:.0f} req/s")
    ax.set(xlabel="offered (req/s)", ylabel="served (req/s)", xlim=(0, top), ylim=(0, top), title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
