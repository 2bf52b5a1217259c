"""What survives a kill (pipeline/records/journal.py): the append-only journal, whole-file writes, and run files
a kill or a full disk left unreadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.records.journal import Journal, read_json, write_json


def test_a_torn_journal_line_is_dropped_on_every_later_resume(tmp_path: Path) -> None:
    j = Journal(tmp_path / "trials.jsonl")
    j.append({"trial": 0})
    with j.path.open("a") as f:
        f.write('{"trial": 1, "sc')  # a kill mid-write
    assert j.load() == [{"trial": 0}]
    j.append({"trial": 1})  # the resumed run re-does trial 1 on a line of its own
    j.append({"trial": 2})
    assert j.load() == [{"trial": 0}, {"trial": 1}, {"trial": 2}]
    assert Journal(j.path).load() == j.load()  # and the next resume reads the same


def test_a_batch_journalled_after_a_torn_line_loads_whole(tmp_path: Path) -> None:
    j = Journal(tmp_path / "trials.jsonl")
    j.append({"trial": 0})
    with j.path.open("a") as f:
        f.write('{"trial": 1, "sc')  # a kill mid-write
    j.extend([{"trial": 1}, {"trial": 2}, {"trial": 3}])
    assert j.load() == [{"trial": k} for k in range(4)]


def test_write_json_replaces_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    write_json(p, {"a": 1})
    write_json(p, {"b": [1, 2]})
    assert json.loads(p.read_text()) == {"b": [1, 2]}
    assert not [x.name for x in tmp_path.iterdir() if x.name.startswith(".state.json")]  # no temporary file left


@pytest.mark.parametrize("content", ["", '{"parent_run_id": "ab', "\x00\x00\x00"], ids=["empty", "torn", "zeros"])
def test_an_unreadable_run_file_is_noted_and_the_run_goes_on_without_it(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "state.json"
    p.write_text(content)
    assert read_json(p, "a new MLflow parent run records the search") is None
    err = capsys.readouterr().err
    assert err.startswith(f"[search] warning: {p} is unreadable (") and "a new MLflow parent run" in err
    assert read_json(tmp_path / "none.json", "") is None and not capsys.readouterr().err  # missing: nothing to say
