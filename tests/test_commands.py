"""Every command keeps one contract with its user: input a user can fix ends in one `error:` line on stderr
naming what, where and how to fix it, and exit code 2, before any expensive work (costmodel/cli.py,
pipeline/cli.py).

Each command is run once as a user runs it (a new process: its argument parsing, Hydra's composition, the
exit code); the long lists of bad values run in this process through the same entry (`helpers.in_process`):
a new interpreter per case would add seconds and check nothing more."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import plan as plans
from costmodel.catalog import CONF_DIR
from helpers import SMALL, cli, in_process, one_line
from pipeline.cli import options_first

COMMANDS = [  # (command, arguments, the line's start); {tmp} is the test's folder
    ("pipeline.search", ["+inventory=nope"], "error: inventory=nope: there is no config 'nope' in group 'inventory'"),
    ("pipeline.search", ["+inventory=nope", "--config-dir", "{tmp}"], "error: inventory=nope: there is no config"),
    ("pipeline.simulate", [], "error: plan=PATH is required"),
    ("pipeline.deploy", [], "error: plan=PATH is required"),
    ("pipeline.island", ["gpu=H9000"], "error: gpu=H9000: there is no config 'H9000' in group 'gpu'"),
    ("pipeline.island", ["gpu=H20", "size=8", "costmodel=nope"],
     "error: costmodel=nope: there is no config 'nope' in group 'costmodel'"),
    ("pipeline.solve_layout", [], "error: no layout given: add +layout=NAME, one of ['table_5_2_a'"),
    ("pipeline.experiment", ["+experiment=nope"], "error: experiment=nope: there is no config 'nope'"),
    ("pipeline.baseline", ["workload=synthetic_fig4_2"], "error: the baseline samples request lengths from a shipped"),
    ("pipeline.traces", ["derive", "{tmp}/t.csv", "/proc/x/o.npz"], "error: /proc/x/o.npz: cannot write it"),
    ("pipeline.ui", ["mlflow.tracking_uri=sqlite:///{tmp}/none.db"], "error: no MLflow store at sqlite:///"),
    ("pipeline.ui", ["--colour"], "error: unrecognized arguments: --colour (usage: python -m pipeline.ui"),
    ("deployment.router", ["{tmp}/none.json"], "error: {tmp}/none.json: cannot read it (No such file"),
    ("solvers.inner", ["{tmp}/none.json"], "error: "),
    ("solvers.expert_placement", ["{tmp}/a.npy", "{tmp}/w.npy"],
     "error: the following arguments are required: --gpus (usage: python -m solvers.expert_placement"),
    ("pipeline.island", ["gpu=H20", "size=8", "costmodel.mem_fraction=0"],
     "error: costmodel.mem_fraction must be a number >= 0.1 and <= 0.98, got costmodel.mem_fraction=0"),
    ("pipeline.island", ["gpu=H20", "size=8", "costmodel.mem_fraction=1.5"],
     "error: costmodel.mem_fraction must be a number >= 0.1 and <= 0.98, got costmodel.mem_fraction=1.5"),
    ("pipeline.island", ["gpu=H20", "size=8", "costmodel.max_running_requests=0"],
     "error: `costmodel.max_running_requests >= 1` (a whole number, or null for no cap) must hold, got "
     "costmodel.max_running_requests=0"),
    ("pipeline.island", ["gpu=H20", "size=8", "costmodel.kv_dtype=int3"],
     "error: costmodel.kv_dtype must be one of ['auto', 'fp8', 'bf16'], got costmodel.kv_dtype='int3'"),
    ("pipeline.island", ["gpu=H200", "size=8", "model.attention=linear", "costmodel=calibrated"],
     "error: conf/model/deepseek_v3.yaml (or its overrides): model deepseek_v3's attention is `linear` (linear "
     "attention"),
    ("pipeline.island", ["gpu=H200", "size=8", "model=llama_3_3_70b", "model.top_k=2", "costmodel=calibrated"],
     "error: conf/model/llama_3_3_70b.yaml (or its overrides): model llama_3_3_70b is dense (n_routed_experts 0), so "
     "`top_k` must be 0, got 2"),
    ("pipeline.island",
     ["gpu=H200", "size=8", "model=qwen3_30b_a3b", "costmodel.calibration=conf/calibration/serving.yaml"],
     "error: costmodel.calibration: calibration 'serving' was fitted to the measured serving of deepseek_v3, and "
     "this plan is for qwen3_30b_a3b: its end-to-end factors correct that model's serving, not this one's; use "
     "costmodel=calibrated"),
    ("pipeline.island", ["gpu=H200", "size=8", "model=qwen3_30b_a3b", "costmodel.fallback.serving=null"],
     "error: costmodel.calibration: calibration 'serving' was fitted to the measured serving of deepseek_v3"),
    ("solvers.expert_placement", ["--example", "{tmp}/t.csv/sample", "--gpus", "8"],
     "error: --example {tmp}/t.csv/sample: cannot write the sample there ({tmp}/t.csv/sample: Not a directory); "
     "give a folder"),
    ("costmodel.readers", ["vllm-bench", "{tmp}/r.jsonl"], "error: argument format: invalid choice: 'vllm-bench'"),
    ("costmodel.calibrate", ["{tmp}/none.csv"], "error: "),
    ("costmodel.reference", ["{tmp}/none.csv"], "error: {tmp}/none.csv: no such file"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "args", "start"), COMMANDS, ids=[f"{c[0]} {' '.join(c[1])}" for c in COMMANDS])
def test_every_command_answers_bad_input_in_one_line(tmp_path: Path, command: str, args: list[str], start: str) -> None:
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,5,3\n")
    r = cli(command, *(a.format(tmp=tmp_path) for a in args), timeout=120)
    one_line(r, start.format(tmp=tmp_path))


def test_hydras_options_may_follow_the_overrides() -> None:
    assert options_first(["+inventory=mine", "--config-dir", "/d", "a=1", "-m", "b=2,3"]) == [
        "--config-dir", "/d", "-m", "+inventory=mine", "a=1", "b=2,3"]  # fmt: skip
    assert options_first(["a=1", "--config-dir"]) == ["a=1", "--config-dir"]  # its value missing: argparse says so
    assert options_first(["~search.x", "+a=1"]) == ["~search.x", "+a=1"]


# --- the search -----------------------------------------------------------------------------------

SEARCH_BAD = [
    (["search.skew_range=abc"], "error: search.skew_range must be a number >= 0, got search.skew_range='abc'"),
    (["ray.cpus_per_trial=0"], "error: ray.cpus_per_trial must be a number >= 0.01, got ray.cpus_per_trial=0"),
    (["search.inner_time_limit_s=-1"], "error: search.inner_time_limit_s must be a number >= 0.001, got"),
    (["ranges.width=100000"], "error: ranges.width=100000 cuts workload azure_code's input lengths 0..7437 into"),
    (["out_root=/proc/x"], "error: out_root=/proc/x: cannot create the folder"),
    (["out_root=/etc/passwd/x"], "error: out_root=/etc/passwd/x: cannot create the folder"),
    (["mlflow.tracking_uri=bogus://nowhere"], "error: mlflow.tracking_uri=bogus://nowhere: MLflow does not know"),
    (["mlflow.tracking_uri=sqlite:////etc/passwd/x.db"],
     "error: mlflow.tracking_uri=sqlite:////etc/passwd/x.db: cannot create the folder"),
    (["mlflow.tracking_uri=http://127.0.0.1:9"], "error: mlflow.tracking_uri=http://127.0.0.1:9: no tracking server"),
    (["ray.address=127.0.0.1:1"], "error: ray.address=127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
    (["+search.skew_rang=3"], "error: search.skew_rang is not a search setting (a typo?)"),
    (["search.sampler=annealing"], "error: search.sampler='annealing' is unknown"),
    (["search.min_island=20"], "error: search.min_island for H200 is 20 but the inventory"),
    (["search.min_island=big"], "error: search.min_island must be a whole number >= 1 or auto"),
    (["search.objective=speed"], "error: search.objective='speed' is unknown"),
    (["search.spare_hosts=-1"], "error: search.spare_hosts must be a whole number >= 0, got search.spare_hosts=-1 (or "
                                "auto: one host where the search can plan for it)"),
    (["search.reference=maybe"], "error: search.reference must be true or false, got search.reference='maybe' (or "
                                 "spare: the optimum with the worst host lost)"),
    (["search.polish=1.5"], "error: `0 <= search.polish < 1` must hold, got"),
    (["search.resume=true"], "error: search.resume=true: no earlier run of this exact config"),
    (["slo.tpot_ms=1"], "error: inventory tiny_hetero: 16 H200 + 16 H800 + 32 H20 ($128.00/h): no layout of it "
     "serves deepseek_v3: a plan needs a prefill island and a decode island at once, and no decode configuration of "
     "16 x H200 meets the TPOT cap of 1.0 ms"),
    (["~inventory.gpus.H200", "~inventory.gpus.H800", "inventory.gpus.H20=4", "search.min_island=1"],
     "error: inventory tiny_hetero: 4 H20 ($4.00/h): no layout of it serves deepseek_v3"),
    (["+inventory=nope"], "error: inventory=nope: there is no config 'nope' in group 'inventory'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "start"), SEARCH_BAD, ids=[" ".join(a) for a, _ in SEARCH_BAD])
def test_a_search_refuses_bad_input_in_one_line_before_any_work(tmp_path: Path, args: list[str], start: str) -> None:
    from pipeline.search.run import execute

    keys = tuple(a.lstrip("+~").partition("=")[0] for a in args)
    own = [a for a in (*SMALL, f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")
           if a.lstrip("+").partition("=")[0] not in keys and not (a.startswith("+inventory") and "+inventory=nope"
                                                                 in args)]  # fmt: skip
    r = in_process(execute, "search", *own, *args)
    one_line(r, start)
    assert not list((tmp_path / "out").glob("*/*/trials.jsonl"))  # refused before any trial
    if (tmp_path / "mlflow.db").exists():  # and no MLflow run left running
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert all(run.info.status != "RUNNING" for run in runs)


def test_a_trace_longer_than_the_models_context_is_refused_when_planning(tmp_path: Path) -> None:
    from pipeline.search.run import execute

    trace = tmp_path / "long.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,40000,2000\n"
                     "2023-11-16 18:17:04,100,20\n")  # fmt: skip
    r = in_process(execute, "search", *SMALL, "model=qwen3_30b_a3b", "workload=trace", f"workload.path={trace}",
                   "ranges.width=100", f"out_root={tmp_path}/out")  # fmt: skip
    one_line(r, "error: workload trace: its longest prompt (40000 tokens) plus its longest output (2000) is 42000 "
             "tokens, over qwen3_30b_a3b's context of 40960")  # fmt: skip


def user_conf(tmp: Path, inventory: str) -> Path:
    d = tmp / "myconf"
    (d / "inventory").mkdir(parents=True)
    (d / "inventory" / "mine.yaml").write_text(inventory)
    return d


def test_an_inventory_in_the_users_own_config_dir_is_found_and_its_errors_are_clear(tmp_path: Path) -> None:
    d = user_conf(tmp_path, "gpus: {H200: 16, H20: 16}\n")
    # the exact planner: the config dir is what this is about, not Ray
    r = cli("pipeline.search", "+inventory=mine", f"--config-dir={d}", "ranges.width=1000", "search.sampler=exact",
            "search.verify=false", "search.band_draws=0", f"out_root={tmp_path}/out",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = plans.load(next((tmp_path / "out").glob("*/*/plan.json")))
    assert plan.inventory is not None and plan.inventory.name == "mine"
    assert dict(plan.inventory.gpus) == {"H200": 16, "H20": 16}
    (d / "inventory" / "broken.yaml").write_text("gpus: {H200: 16\n")
    r = in_process(lambda cfg: None, "search", f"hydra.searchpath=[file://{d}]", "+inventory=broken")
    one_line(r, "error: ")
    assert "broken.yaml" in r.stderr or "while parsing" in r.stderr, r.stderr


def test_a_gpu_file_with_a_bad_figure_is_named_not_called_unknown(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    text = (conf / "gpu" / "H20.yaml").read_text()
    (conf / "gpu" / "H20.yaml").write_text("\n".join(
        "mem_gb: 0" if ln.startswith("mem_gb:") else ln for ln in text.splitlines()) + "\n")  # fmt: skip
    r = cli("pipeline.search", *SMALL, f"out_root={tmp_path}/out", env={"ARCHIPELAGO_CONF": str(conf)})
    one_line(r, "error: ")
    assert "H20.yaml" in r.stderr and "mem_gb" in r.stderr and "unknown GPU" not in r.stderr, r.stderr


# --- the other commands ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["size=-3"], "error: `size >= 1` (whole number) must hold, got size=-3"),
        (["gpu.mem_gb=-1"], "error: conf/gpu/H200.yaml (or its overrides): `mem_gb > 0` must hold for GPU H200"),
        (["+costmodel.fixes.warp_drive=true"], "error: costmodel: unknown cost-model switch ['warp_drive']"),
        (["rows=-1"], "error: `rows >= 0` (whole number; 0 = every range) must hold, got rows=-1"),
        (["costmodel.cache_hit=1.5"], "error: `0 <= costmodel.cache_hit < 1` must hold"),
        (["gpu=H20", "size=4"], "error: 4 x H20 cannot hold deepseek_v3's weights"),
        (["slo.ttft_percentile=101"], "error: slo.ttft_percentile must be a number >= 50 and <= 99.99"),
        (["+slo.tbt_ms=5"], "error: slo.tbt_ms is not an SLO setting"),
    ],
)
def test_the_island_command_refuses_bad_values_in_one_line(args: list[str], start: str) -> None:
    from pipeline.island import execute

    one_line(in_process(execute, "island", *args), start)


def test_the_island_command_lists_the_gpus_it_knows() -> None:
    from pipeline.island import execute

    r = in_process(execute, "island", "gpu=H2000")
    one_line(r, "error: gpu=H2000: there is no config 'H2000' in group 'gpu'")
    assert "'H200'" in r.stderr and "'MI300X'" in r.stderr


def test_plain_commands_name_the_file_and_the_field(tmp_path: Path) -> None:
    prob = tmp_path / "p.json"
    base = {"islands": [{"gpu": "H200", "size": 8}], "ranges": [{"start": 0, "end": 10, "p": 1.0}],
            "prefill_req_s": [[1.0]], "decode_req_s": [[1.0]]}  # fmt: skip
    for extra, start in (({"roles": 5}, "`roles` must list"), ({"time_limit_s": -1}, "`time_limit_s` must be")):
        prob.write_text(json.dumps({**base, **extra}))
        one_line(cli("solvers.inner", str(prob)), f"error: {prob}: {start}")
    a, w = tmp_path / "a.npy", tmp_path / "w.npy"
    np.save(a, np.ones((3, 8)))
    np.save(w, np.ones((5, 7)))
    r = cli("solvers.expert_placement", str(a), str(w), "--gpus", "2", "--method", "heuristic")
    one_line(r, f"error: {w}: the traffic matrix must be experts x experts (8 x 8")
