"""Every chapter-5 experiment in smoke mode, end to end through real Ray, Optuna, OR-Tools and MLflow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from costmodel.catalog import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def run(tmp: Path, name: str, *extra: str) -> tuple[int, Path]:
    """`python -m pipeline.experiment +experiment=NAME experiment.smoke=true ...`, in this process."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from pipeline.experiment.run import run_experiment

    passthrough = [f"out_root={tmp}/search", f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db", *extra]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "search", [f"+experiment={name}", "experiment.smoke=true", *passthrough], return_hydra_config=True
        )
        HydraConfig.instance().set_config(cfg)
        code = run_experiment(cfg, passthrough)
    (folder,) = (tmp / "experiments").glob(f"{name}-smoke-*")
    return code, folder


def children(tmp: Path, folder: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("archipelago")
    parent = json.loads((folder / "state.json").read_text())["parent_run_id"]
    return client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent}'", max_results=1000)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_in_smoke_mode(tmp_path: Path, local_ray: Any, name: str) -> None:
    from omegaconf import OmegaConf

    code, folder = run(tmp_path, name)
    assert code == 0
    spec = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")
    axes = {**spec.axes, **(spec.get("smoke_axes") or {})}
    n_cells = 1
    for values in axes.values():
        n_cells *= len(values)
    summary = pd.read_parquet(folder / "summary.parquet")
    assert len(summary) == n_cells
    ran = summary[summary["skipped"] == ""]
    for _, cell in summary[summary["skipped"] != ""].iterrows():  # only a missing optional extra skips a cell
        assert cell["sampler"] in ("gp", "saasbo") and f"pip install -e '.[{cell['sampler']}]'" in cell["skipped"]
    assert len(ran) > 0
    trials = spec.smoke_trials
    expected_searches = sum(1 if s == "exact" else trials for s in ran["sampler"])
    assert ran["searches"].sum() == expected_searches and (ran["failed"] == 0).all()
    # a search never beats the global optimum of the same model, and finds a positive rate
    assert (ran["best_max"] <= ran["exact"] * (1 + 1e-6)).all()
    assert (ran["best_min"] > 0).all()
    results = pd.read_parquet(folder / "results.parquet")
    assert len(results) == (ran["evaluations"] * ran["searches"]).sum()
    table = (folder / "table.md").read_text()
    assert table.startswith("# ") and f"+experiment={name}" in table
    body = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln]
    if spec.table == "table_5_1":
        assert [ln.split("|")[1].strip() for ln in body[1:4]] == ["hetero_a", "hetero_b", "homo_c"]
        assert any(ln.startswith("| hetero_a / homo_c |") for ln in body)
    else:
        assert len(body) == 1 + n_cells  # header + one row per cell
    assert (folder / "convergence.png").stat().st_size > 0
    # one panel per value of the first axis when there are two, one series per cell that ran
    drawn = json.loads((folder / "plots.json").read_text())
    assert sum(len(v) for v in drawn.values()) == len(ran)
    if len(axes) == 2:
        assert sorted(k for k, series in drawn.items() if series) == sorted({str(v) for v in ran[next(iter(axes))]})
    assert (folder / "timing.png").exists() == bool(spec.timing)
    assert len(children(tmp_path, folder)) == expected_searches


def test_a_rerun_finishes_only_the_missing_searches(tmp_path: Path, local_ray: Any) -> None:
    code, folder = run(tmp_path, "fig_5_12")
    assert code == 0
    journal = folder / "searches.jsonl"
    lines = journal.read_text().splitlines()
    assert len(lines) == 4  # 2 K values x 2 trials in smoke mode
    journal.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])  # the last search was cut short by a kill
    code, again = run(tmp_path, "fig_5_12")
    assert code == 0 and again == folder
    recs = [json.loads(ln) for ln in journal.read_text().splitlines() if ln.endswith("}")]
    assert len(recs) == 4 and recs[:3] == [json.loads(ln) for ln in lines[:3]]  # finished searches kept, not re-run
    assert {(r["cell"], r["seed"]) for r in recs} == {(json.loads(ln)["cell"], json.loads(ln)["seed"]) for ln in lines}
    assert len(pd.read_parquet(folder / "results.parquet")) == 4 * 4  # 4 searches x (2 iterations x batch 2)


def test_unknown_or_missing_experiment_is_one_line(tmp_path: Path) -> None:
    for args, want in [
        (["+experiment=nope"], "error: experiment=nope: there is no config 'nope' in group 'experiment'"),
        ([], "error: choose an experiment: +experiment=NAME with NAME one of ["),
    ]:
        r = subprocess.run(
            [sys.executable, "-m", "pipeline.experiment", *args, f"out_root={tmp_path}/search"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().startswith(want) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unproven_exact_reference_is_starred() -> None:
    """A cell's exact reference whose solve its time limit ended before proving the optimum (references.json status
    `feasible`) is a lower bound, and the tables say so with a star; a proven one, or an older summary without the
    flag, prints plain."""
    import pandas as pd

    from pipeline.experiment.report import _exact

    assert _exact(pd.Series({"exact": 743.2, "exact_proven": False}), 1) == "743.2*"
    assert _exact(pd.Series({"exact": 449.8064, "exact_proven": True}), 2) == "449.81"
    assert _exact(pd.Series({"exact": 378.1}), 1) == "378.1"
