"""The shallowsim profile against every row of the original program's outputs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from costmodel import reference
from costmodel.catalog import load_model


def test_every_reference_row_within_1e9(reference_csv: Path) -> None:
    worst, rows = reference.check(reference_csv, load_model("deepseek_v3"))
    assert rows == 273
    assert max(worst.values()) <= 1e-9, worst
    # every metric family of the spec's section 7 is covered
    assert {"prefill_total_Sum", "decode_TPOT", "max_batch_size", "search_best_Total"} <= set(worst)


def test_cli_last_line_and_exit_code(reference_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main([str(reference_csv)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("rows=273 max_rel_err=")
    assert float(last.split("max_rel_err=")[1]) <= 1e-9


def test_cli_fails_on_a_perturbed_row(reference_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = list(csv.DictReader(reference_csv.open()))
    rows[5]["output_value"] = repr(float(rows[5]["output_value"]) * (1 + 1e-6))
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert reference.main([str(bad)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert 9e-7 < float(last.split("max_rel_err=")[1]) < 1.1e-6


def test_cli_clear_error_on_malformed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert reference.main([str(bad)]) == 2
    assert "expected columns" in capsys.readouterr().err
    assert reference.main([str(tmp_path / "missing.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_ctrl_c_that_lands_in_a_callback_still_stops_the_reference() -> None:
    """Python drops a KeyboardInterrupt raised inside a callback ("Exception ignored": a weakref callback
    in garbage collection, fork's hooks), and the search used to go on solving. Here Ctrl-C arrives inside
    a weakref callback while a 30 s solve runs in the child: the wait still stops at once."""
    import os
    import signal
    import time
    import weakref

    from pipeline.search.reference import interruptible

    class Thing:
        pass

    def tick() -> None:  # the progress display's hook, called while the parent waits
        thing = Thing()
        weakref.finalize(thing, os.kill, os.getpid(), signal.SIGINT)
        del thing  # the finalizer runs here, and the signal lands inside it

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        interruptible(time.sleep, 30, tick=tick)
    assert time.perf_counter() - t0 < 10
