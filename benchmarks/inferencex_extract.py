"""Extract InferenceX's DeepSeek-R1 measurements into conf/measured/inferencex_dsr1.csv.

    python benchmarks/inferencex_extract.py FIXTURE.json > conf/measured/inferencex_dsr1.csv

FIXTURE is the InferenceX app's API fixture of benchmark results (`packages/app/cypress/fixtures/api/
benchmarks.json`: one object per measured configuration, its metrics in seconds and tokens/s/GPU). Only the
measured facts are kept: the configuration, the load and the headline metrics, with each row's benchmark run URL
(conf/measured/README.md says what each column means).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

CONFIG = ["hardware", "framework", "precision", "spec_method", "disagg", "is_multinode",
          "prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers",
          "decode_tp", "decode_ep", "decode_dp_attention", "decode_num_workers",
          "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc"]  # fmt: skip
METRICS = ["median_ttft", "median_tpot", "median_itl", "median_e2el", "median_intvty", "p99_ttft", "p99_tpot",
           "mean_ttft", "mean_tpot", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu"]  # fmt: skip
TAIL = ["image", "date", "run_url"]


def rows(fixture: list[dict]) -> list[list[str]]:
    out = []
    for r in fixture:
        if r.get("model") != "dsr1":
            continue
        m = r["metrics"]
        cells = [str(r[k]).lower() if isinstance(r[k], bool) else str(r[k]) for k in CONFIG]
        cells += ["" if m.get(k) is None else repr(float(m[k])) for k in METRICS]
        cells += [r.get("image") or "", r["date"], r["run_url"]]
        out.append(cells)
    out.sort(key=lambda c: (c[0], c[1], c[2], c[3], c[4], int(c[16]), int(c[17]), int(c[18]), c[-1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fixture")
    args = ap.parse_args()
    with open(args.fixture, encoding="utf-8") as f:
        fixture = json.load(f)
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(CONFIG + METRICS + TAIL)
    w.writerows(rows(fixture))
    return 0


if __name__ == "__main__":
    sys.exit(main())
