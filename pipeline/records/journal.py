"""What survives a kill: the append-only journal of finished work, and whole-file writes that are atomic.

A search journals every finished trial (`trials.jsonl`), an experiment every finished search
(`searches.jsonl`): one JSON line each, flushed and fsynced before the next starts (a batch of
trials that came back together goes in one write). A kill can cut only the last line short;
`load` drops such a line, and the next `append` starts on a fresh line, so a torn line never
swallows the record after it, on this resume or any later one.

`write_json` (plan.json, state.json, reference.json, ...) writes a temporary file beside the
target and renames it over: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[dict[str, Any]]:
        """Every intact record, in order; a torn line (a kill mid-write) is skipped."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def append(self, rec: Mapping[str, Any]) -> None:
        self.extend([rec])

    def extend(self, recs: Sequence[Mapping[str, Any]]) -> None:
        """Records that finished together (a batch of trials): one write, one fsync."""
        if not recs:
            return
        cut = False  # the file ends mid-line after a kill: start these records on a line of their own
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
        try:
            with self.path.open("a") as f:
                f.write(("\n" if cut else "") + "".join(json.dumps(rec, default=float) + "\n" for rec in recs))
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:  # a write's error names no file: this one does
            raise OSError(err.errno, err.strerror, str(self.path)) from err


def write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (temporary file in the same folder, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link_latest(root: Path, target: Path) -> None:
    """Point `root/latest` at `target` (a finished run's folder), replacing the old link atomically;
    never fails the run over it (a filesystem without symlinks simply has no link)."""
    link = root / "latest"
    tmp = root / f".latest.{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(target, root), target_is_directory=True)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, default=float) + "\n")


def read_json(path: Path, otherwise: str) -> Any:
    """The JSON in `path`, or None when there is none; a file a kill or a full disk left unreadable is noted
    on stderr with what happens instead (`otherwise`), and is None too: the run goes on without it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        print(f"[search] warning: {path} is unreadable ({type(err).__name__}: {' '.join(str(err).split())[:120]}): "
              f"{otherwise}", file=sys.stderr, flush=True)  # fmt: skip
        return None
