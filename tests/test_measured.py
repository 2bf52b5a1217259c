"""conf/measured/inferencex_dsr1.csv: every InferenceX DeepSeek-R1 row loads, checked, with InferenceX's own metric
identities holding; a malformed file is one error naming its line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from costmodel.measured import FITTING_GPUS, INFERENCEX, load_inferencex, serving_rows
from costmodel.measurements import MeasurementError


def test_every_row_loads_with_its_run_and_inferencex_s_identities_hold() -> None:
    rows = load_inferencex()
    assert len(rows) == 435 and all(r.run_url.startswith("https://github.com/SemiAnalysisAI/InferenceX/actions/runs/")
                                    for r in rows)  # fmt: skip
    by_gpu = Counter(r.hardware for r in rows)
    assert set(by_gpu) == {"h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x"}
    assert sum(r.fitting for r in rows) == sum(by_gpu[g] for g in FITTING_GPUS) == 165  # 50 + 100 + 15
    for r in rows:
        m = r.metrics
        assert m["median_intvty"] * m["median_tpot"] == pytest.approx(1.0, rel=1e-9), r.line  # interactivity = 1/TPOT
        if not r.disagg and "input_tput_per_gpu" in m:  # one engine kind: total = input + output per GPU
            assert m["input_tput_per_gpu"] + m["output_tput_per_gpu"] == pytest.approx(m["tput_per_gpu"], rel=1e-9)
        assert r.gpus == (r.prefill.gpus + r.decode.gpus if r.disagg else r.decode.tp) >= 1
        if r.conc == 1:  # one user: tokens/s/GPU x GPUs x E2E latency = a request's tokens (lengths on [0.8 L, L])
            tokens = m["tput_per_gpu"] * r.gpus * m["median_e2el"]
            assert tokens / ((r.isl + r.osl) * 0.9) == pytest.approx(1.0, abs=0.05), r.key


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("hardware,", "gpu,", 1), "lacks the column(s) ['hardware']"),
        (lambda t: t.replace(",true,", ",yes,", 1), ":2: 'yes': a number or true/false expected"),
        (lambda t: t.replace(",1024,1024,256,", ",1024,1024,-256,", 1), ":2: a metric or count out of range"),
        (lambda t: t.replace(",fp4,", ",int3,", 1), ":2: precision fp8|fp4 and spec_method none|mtp expected"),
        (lambda t: t.splitlines()[0] + "\n", "no rows"),
        # rows the fit would read as something else: refused, each naming the line and the value
        (lambda t: t.replace(",6,4,48,1024,", ",6,4,0,1024,", 1), ":2: decode_tp 8, decode_ep 8, num_decode_gpu 0: "
                                                                  "each must be 1 or more"),
        (lambda t: t.replace(",8,8,false,6,", ",0,8,false,6,", 1), ":2: decode_tp 0, decode_ep 8, num_decode_gpu 48"),
        (lambda t: t.replace(",8,8,false,6,", ",3,8,false,6,", 1), ":2: decode_tp 3 without DP attention: an "
                                                                   "attention TP is a power of two"),
        (lambda t: t.replace(",0.008918067023589661,", ",1e308,", 1), ":2: median_tpot 1e+308 s per token, over the "
                                                                      "10 any engine takes"),
        (lambda t: t.replace("\nb200,", "\nx100,", 1), ":2: hardware 'x100' is none of InferenceX's GPUs the "
                                                        "catalogue maps"),
    ],
)
def test_a_malformed_extract_is_one_error_naming_the_line(tmp_path: Path, edit: object, message: str) -> None:
    path = tmp_path / "x.csv"
    path.write_text(edit(INFERENCEX.read_text()))  # type: ignore[operator]
    with pytest.raises(MeasurementError, match=None) as err:
        load_inferencex(path)
    assert message in str(err.value) and str(path) in str(err.value)
    path.write_bytes(b"\xff\xfe" * 10)
    with pytest.raises(MeasurementError, match="cannot read it as text"):
        load_inferencex(path)


def test_the_bench_predicts_rows_by_simulating_them_and_names_every_row_it_cannot() -> None:
    import re
    import subprocess
    import sys

    root = INFERENCEX.parents[2]
    r = subprocess.run([sys.executable, "benchmarks/inferencex_bench.py", "--rows", "3", "--gpu", "h200,gb200"],
                       cwd=root, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()
    assert head[0].startswith("InferenceX DeepSeek-R1: 100 rows")  # H200's and GB200's
    counts = [int(n) for n in re.findall(r"(\d+) [a-zA-Z]", head[1].split(";")[0].removeprefix("not expressible: "))]
    expressible = int(re.search(r"expressible (\d+),", head[1]).group(1))  # type: ignore[union-attr]
    # every row but GB200's 8 disaggregated rows without their workers (MTP and aggregated rows included)
    assert sum(counts) + expressible == 100 and expressible == 92 and "8 workers not recorded" in head[1]
    assert head[1].endswith("simulated 3")
    rows = [ln for ln in head if ln.startswith(("| h200 | ", "| gb200 | ")) and "median_tpot" in ln]
    assert rows and all(int(ln.split("|")[4]) >= 1 for ln in rows)
    done = re.search(r"(\d+) rows simulated and (\d+) refused by the model", r.stdout)
    assert done and int(done.group(1)) + int(done.group(2)) == 3  # GB200's TP-1 rows leave no KV room: refused
    assert r.stdout.count("- model refuses ") == int(done.group(2))


def test_a_row_becomes_the_serving_measurement_its_engines_run() -> None:
    """A disaggregated row's users over its decode workers and their attention ranks; an aggregated row's over its
    one engine, with the prompts it prefills meanwhile; mean lengths on [0.8 L, L]; MTP's published acceptance."""
    from costmodel.measured import serving_measurement

    rows = load_inferencex()
    # b200 dynamo-sglang fp4 mtp, 1k/1k, 256 users, decode: 6 workers of 8 GPUs, TP 8, EP 8, no DP attention
    disagg = next(r for r in rows if r.line == 2)
    m = serving_measurement(disagg)
    assert m is not None and m.gpu == "DGX-B200" and m.unit == "s" and m.value == disagg.metrics["median_tpot"]
    assert m.params == {"batch": 43, "context": 922 + 461, "tp": 8, "ep": 8, "moe": "ep", "precision": "fp4",
                        "drafts": 1, "accepted_pct": 85, "kv": "fp8"}  # fmt: skip (its launch: an FP8 KV cache)
    agg = next(r for r in rows if not r.disagg and r.hardware == "h200" and r.decode.ep == 1 and r.conc == 32)
    p = serving_measurement(agg).params  # type: ignore[union-attr]
    assert p["moe"] == "tp" and p["ep"] == agg.decode.tp and p["users"] == 32
    assert p["prefill_len"] == round(0.9 * agg.isl) and p["output_len"] == round(0.9 * agg.osl)
    assert serving_measurement(next(r for r in rows if r.disagg and not r.decode.workers)) is None


def test_the_fits_prediction_is_the_simulators_on_the_same_rows() -> None:
    """costmodel.calibrate fits serving rows by their steady state (serving_tpot_ms); the bench simulates them
    request by request. On rows of every kind the two TPOTs agree within 5 %, so what the fit minimises is what
    the bench reports."""
    import sys

    from costmodel.calibrate import predict
    from costmodel.calibration import load_calibration
    from costmodel.catalog import load_model
    from costmodel.measured import serving_measurement, ttft_measurement
    from costmodel.profile import CostProfile
    from costmodel.settings import CostSettings

    sys.path.insert(0, str(INFERENCEX.parents[2] / "benchmarks"))
    import inferencex_bench as bench

    profile = CostProfile.corrected().calibrated(load_calibration(INFERENCEX.parents[1] / "calibration/serving.yaml"))
    cost = CostSettings(profile)
    rows = load_inferencex()
    picked = [next(r for r in rows if r.hardware == g and r.disagg == d and r.spec_method == s)
              for g, d, s in (("h200", True, "none"), ("b200", False, "mtp"), ("mi355x", False, "none"))]  # fmt: skip
    for row in picked:
        sim = bench.simulate(row, load_model("deepseek_v3"), cost).metrics["median_tpot"]
        steady = predict(serving_measurement(row), profile)  # type: ignore[arg-type]
        assert steady == pytest.approx(sim, rel=0.05), row.key
    # and the time to first token of rows too few users to queue (the front end, the prefill, the hand-off)
    few = [next(r for r in rows if r.hardware == g and r.disagg == d and r.conc <= 4)
           for g, d in (("b200", True), ("h200", False))]  # fmt: skip
    for row in few:
        sim = bench.simulate(row, load_model("deepseek_v3"), cost).metrics["median_ttft"]
        steady = predict(ttft_measurement(row), profile)  # type: ignore[arg-type]
        assert steady == pytest.approx(sim, rel=0.1), row.key


def test_the_serving_fit_saw_only_the_fitting_gpus() -> None:
    """conf/calibration/serving.yaml: its end-to-end factors are the stacks' and every GPU's, fitted on H200, B200
    and MI300X rows only; no check GPU has a factor of its own, and the engine behaviour it assumed travels with it."""
    from costmodel.calibration import load_calibration
    from costmodel.measured import GPUS, serving_rows

    rows = serving_rows(INFERENCEX)
    assert {r.gpu for r in rows} == {GPUS[g] for g in FITTING_GPUS} and len(rows) == 165 + 74  # TPOT; TTFT, <= 16 users
    cal = load_calibration(INFERENCEX.parents[1] / "calibration/serving.yaml")
    assert dict(cal.switches) == {"gemm_roofline": True, "activated_experts": True, "overlap_chosen": True,
                                  "step_overhead": True, "sequence_overhead": True, "dp_imbalance": True,
                                  "request_overhead": True, "node_dispatch": True, "lm_head": True,
                                  "draft_passes": True, "net_allreduce": True}  # fmt: skip
    fitted = {(g, k) for g, k, f in cal.factors if f.origin == "fit"}
    for g in ("H100-SXM", "DGX-B300", "GB200-NVL72", "GB300-NVL72", "MI325X", "MI355X"):
        assert not any(gpu == g for gpu, _ in fitted), g
    assert ("*", "moe_tp") in fitted and ("*", "step_overhead") in fitted and ("rocm", "hbm") in fitted
    assert ("*", "sequence_overhead") in fitted
    # a check GPU's factor is its stack's times every GPU's: MI355X takes ROCm's, measured on MI300X only
    assert cal.get("MI355X", "hbm", "rocm").factor == pytest.approx(cal.table[("rocm", "hbm")].factor)


def test_an_extract_without_a_row_of_the_fitting_gpus_is_refused_by_the_serving_fit(tmp_path: Path) -> None:
    """`costmodel.calibrate --serving` on rows of GPUs it never fits (gb200 only): one error, not a fit of 0 rows."""
    lines = INFERENCEX.read_text().splitlines()
    path = tmp_path / "gb200.csv"
    path.write_text("\n".join([lines[0], *(x for x in lines[1:] if x.startswith("gb200,"))]) + "\n")
    with pytest.raises(MeasurementError) as err:
        serving_rows(path)
    assert str(err.value) == (
        f"{path}: none of its 50 rows is one the fit reads (a disaggregated row with its workers recorded, or an "
        "aggregated one) on a fitting GPU ['h200', 'b200', 'mi300x']: --serving fits those GPUs' rows only"
    )


def test_each_rows_decode_engines_admit_what_their_launch_let_them(tmp_path: Path) -> None:
    """conf/measured/inferencex_admission.csv: every row has its line; where the launch set a limit below the
    users, only that many run (line 268: H200 Dynamo-SGLang, 2,048 users on 6 decode engines of 8 DP-attention
    ranks launched with --max-running-requests 128, which SGLang splits into 16 a rank: 768 run, 16 a rank); a
    table that does not describe the extract's rows is one error naming its line."""
    import csv

    from costmodel.measured import ADMISSION, load_admission, running, users_per_rank

    rows = load_inferencex()
    with ADMISSION.open(newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    assert sorted(int(d["line"]) for d in table) == sorted(r.line for r in rows)
    for d in table:  # a limit always names where it was read; an unresolved row says why
        assert d["status"].split(";")[0].split(" ")[0].split("(")[0] in ("ok", "partial", "unresolved")
        assert d["source"] or (d["status"].startswith("unresolved (") and not d["engine_max_running"])
    row = next(r for r in rows if r.line == 268)
    assert (row.hardware, row.framework, row.conc, row.decode.workers, row.max_running) == (
        "h200", "dynamo-sglang", 2048, 6, 128)  # fmt: skip
    assert running(row) == 768 and users_per_rank(row) == 16
    # line 287: H200 SGLang on one node, --mem-fraction-static 0.82 and no --kv-cache-dtype (SGLang's auto: BF16);
    # line 72: B200 TensorRT-LLM, an FP8 KV cache and a share of the free memory (not SGLang's quantity: not read)
    by = {r.line: r for r in rows}
    assert (by[287].framework, by[287].mem_fraction, by[287].kv_dtype) == ("sglang", 0.82, "bf16")
    assert (by[72].framework, by[72].mem_fraction, by[72].kv_dtype) == ("trt", None, "fp8")
    from costmodel.measured import serving_measurement

    assert dict(serving_measurement(by[287]).params)["kv"] == "bf16"  # the fit prices its KV cache as it ran
    expressible = [r for r in rows if not (r.disagg and not (r.prefill.workers and r.decode.workers))]
    capped = [r for r in expressible if running(r) < r.conc]
    assert len(capped) == 68 and all(r.max_running is not None for r in capped)
    table[0] = {**table[0], "hardware": "h100" if table[0]["hardware"] != "h100" else "h200"}
    bad = _written(tmp_path / "admission.csv", table)
    with pytest.raises(MeasurementError, match=rf"admission.csv:2: line {table[0]['line']} is not that row"):
        load_admission(bad, rows)


def test_each_sglang_engine_polls_for_requests_as_its_launch_set(tmp_path: Path) -> None:
    """`scheduler_recv_interval` (inferencex_admission.csv): InferenceX's B200 and B300 SGLang scripts launch TP 8 with
    --scheduler-recv-interval 10 below 16 users and 30 from 16 (benchmarks/single_node/dsr1_fp8_b300.sh); the other
    rows poll every step (1). A few-user TTFT of such an engine waits (N - 1) / 2 decode steps more than one polling
    every step (costmodel.calibrate.serving_ttft_ms); an interval of 0 is one error naming its line."""
    import csv
    import dataclasses

    from costmodel.calibrate import predict
    from costmodel.calibration import load_calibration
    from costmodel.catalog import load_gpu, load_model
    from costmodel.formulas import DecodeRun, decode_step_ms
    from costmodel.measured import ADMISSION, load_admission, ttft_measurement
    from costmodel.profile import CostProfile

    rows = load_inferencex()
    by = {r.line: r for r in rows}
    b300 = [r for r in rows if r.hardware == "b300" and r.framework == "sglang" and r.decode.tp == 8
            and r.spec_method == "none" and r.precision == "fp8"]  # fmt: skip
    assert {(r.conc, r.recv_interval) for r in b300} == {(1, 10), (4, 10), (16, 30), (64, 30)}
    assert sum(r.recv_interval > 1 for r in rows) == 50
    assert all(r.recv_interval == 1 for r in rows if r.hardware in ("h200", "mi300x", "mi355x") or r.disagg)
    row = next(r for r in b300 if r.conc == 4)
    m = ttft_measurement(row)
    assert m is not None and m.params["recv"] == 10
    profile = CostProfile.corrected().calibrated(load_calibration(INFERENCEX.parents[1] / "calibration/serving.yaml"))
    every = ttft_measurement(dataclasses.replace(row, recv_interval=1))
    assert every is not None and "recv" not in every.params
    p = m.params
    run = DecodeRun(moe_tp=p["moe"] == "tp", kv_dtype=p.get("kv", "auto"))
    step = decode_step_ms(load_gpu("DGX-B300"), load_model("deepseek_v3"), p["context"], p["batch"], p["tp"], p["ep"],
                          profile=profile.with_fixes(experts_fp8=True), run=run)  # fmt: skip
    assert predict(m, profile) - predict(every, profile) == pytest.approx(4.5 * float(step) / 1e3, rel=1e-9)
    with ADMISSION.open(newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    k = next(i for i, d in enumerate(table) if d["scheduler_recv_interval"])
    table[k] = {**table[k], "scheduler_recv_interval": "0"}
    bad = _written(tmp_path / "admission.csv", table)
    with pytest.raises(MeasurementError, match=rf"admission.csv:{k + 2}: scheduler_recv_interval must be 1 or more"):
        load_admission(bad, list(by.values()))


def _written(path: Path, table: list[dict[str, str]]) -> Path:
    """`table` (an admission table's rows) written to `path` as CSV."""
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    return path


def test_the_published_tensorrt_llm_rows_name_catalogue_models_and_gpus_and_their_commits() -> None:
    """conf/measured/trtllm_offline.csv and trtllm_online.csv (benchmarks/trtllm_bench.py's check, never fitted): every
    row names a catalogue model and GPU, the commit of NVIDIA's performance overview it was read at, an engine shape
    the bench can build (EP dividing the engine's GPUs, DP attention only with experts), and positive measurements;
    one row of each table simulates to a positive throughput."""
    import csv
    import re
    import sys

    from costmodel.catalog import load_gpu, load_model

    sys.path.insert(0, str(INFERENCEX.parents[2] / "benchmarks"))
    import trtllm_bench as bench

    for path in (bench.OFFLINE, bench.ONLINE):
        rows = list(csv.DictReader(path.open()))
        assert rows, path
        for row in rows:
            model, gpu = load_model(row["model"]), load_gpu(row["gpu"])
            assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]) and gpu.name == row["gpu"]
            tp, ep = int(row["tp"]), int(row["ep"])
            assert tp % ep == 0 and (row["dp_attention"] == "false" or not model.dense)
            assert int(row["isl"]) > 0 and int(row["osl"]) > 0 and float(row["output_tok_s"]) > 0
            assert row.get("kv_dtype", "") in ("", "fp8", "bf16"), row
    from common import context

    # a row's KV format, where the overview's options name it, is the one its engine holds: BF16 fits half the tokens
    row = next(r for r in csv.DictReader(bench.OFFLINE.open()) if r["model"] == "gpt_oss_120b" and r["gpu"] == "H200")
    assert row["kv_dtype"] == "bf16"
    _, ctx = context(["+inventory=tiny_homo", "model=gpt_oss_120b", "costmodel=calibrated"])
    bf16 = bench.engine(row, ctx.planner.model, ctx.planner.cost)[0].decode.kv_tokens
    fp8 = bench.engine({**row, "kv_dtype": "fp8"}, ctx.planner.model, ctx.planner.cost)[0].decode.kv_tokens
    assert bf16 == pytest.approx(fp8 / 2, rel=0.01)
    # as TensorRT-LLM of these releases ran GPT-OSS: every layer's KV at the whole sequence's length (a sliding layer
    # too: 576 of 1,024 tokens a layer on average where the model keeps a sliding layer's 128-token window), and,
    # its MXFP4 quantisation untuned by trtllm-bench, 2,048 sequences a rank and a step of max(8,192, prompt + 2,048)
    model = ctx.planner.model
    assert float(model.held(1024.0)) == pytest.approx((18 * 1024 + 18 * 128) / 36)
    e, seqs = bench.engine(row, model, ctx.planner.cost)
    isl, osl = int(row["isl"]), int(row["osl"])
    assert seqs == min(int(e.decode.kv_tokens * 576 / 1024 // (isl + osl)), 2048) and e.chunk == 8192
    long = next(r for r in csv.DictReader(bench.OFFLINE.open())
                if r["model"] == "gpt_oss_120b" and r["isl"] == "32768" and r["gpu"] == "H200")  # fmt: skip
    assert bench.engine(long, model, ctx.planner.cost)[0].chunk == 32768 + 2048
    llama = next(r for r in csv.DictReader(bench.OFFLINE.open()) if r["model"] == "llama_3_3_70b" and r["gpu"] == "H200"
                 and r["isl"] == "128")  # fmt: skip
    _, lctx = context(["+inventory=tiny_homo", "model=llama_3_3_70b", "costmodel=calibrated"])
    e, seqs = bench.engine(llama, lctx.planner.model, lctx.planner.cost)  # FP8, tuned: the bench's one setting
    ranks = e.decode.ranks
    assert e.chunk == bench.CHUNK * ranks and seqs == min(e.decode.kv_tokens // (128 + int(llama["osl"])),
                                                          bench.MAX_BATCH * ranks)  # fmt: skip

    for path, rate in ((bench.OFFLINE, None), (bench.ONLINE, 4.0)):
        row = next(r for r in csv.DictReader(path.open()) if r["gpu"] == "H200")
        _, ctx = context(["+inventory=tiny_homo", f"model={row['model']}", "costmodel=calibrated"])
        got = bench.simulate(row, ctx.planner.model, ctx.planner.cost, 200, rate)
        assert got["output_tput_per_gpu"] > 0
