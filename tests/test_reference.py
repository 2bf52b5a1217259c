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
