"""Writes the plans the launch-file tests check (tests/data/plans/README.md): the exact reference's
plan of each thesis Table 5.1 cell (hetero_a, hetero_b, homo_c x Azure code, conversation).

    .venv/bin/python tests/data/plans/derive.py      # from the checkout's root
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))

from common import exact_plan  # noqa: E402

import plan as plans  # noqa: E402


def main() -> None:
    for inv in ("hetero_a", "hetero_b", "homo_c"):
        for wl in ("azure_code", "azure_conv"):
            _, _, p = exact_plan([f"+inventory={inv}", f"workload={wl}"])
            out = HERE / f"table_5_1_{inv}_{wl}.json"
            out.write_text(json.dumps(plans.to_json(p), indent=1) + "\n")
            print(f"{out.name}: {p.rate_req_s:.2f} req/s, {sum(1 for i in p.islands if i.serving)} serving islands")


if __name__ == "__main__":
    main()
