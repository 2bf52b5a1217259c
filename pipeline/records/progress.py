"""Progress of a long phase: a tqdm bar on a terminal, plain `[tag] ...` lines elsewhere.

On a terminal (stderr a TTY) the bar shows what is running, how far it is, the elapsed time and,
where the phase knows its total, an estimate of the rest. In a log, a pipe or a test the same
phase prints a line when it moves on by at least `every_s` seconds, and its last state once:
logs stay readable and nothing depends on carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, tag: str, desc: str, total: float | None = None, unit: str = "it", every_s: float = 2.0) -> None:
        self.tag, self.desc, self.total, self.unit, self.every_s = tag, desc, total, unit, every_s
        self.t0 = time.perf_counter()
        self.last_line = self.t0  # the first line after `every_s`: a short phase prints none
        self.last_text = ""
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            fmt = "{desc}: {n:.0f}/{total:.0f} " + unit + " [{elapsed}<{remaining}{postfix}]" if total else None
            self.bar = tqdm(total=total, desc=f"[{tag}] {desc}", unit=unit, bar_format=fmt, leave=True,
                            dynamic_ncols=True)  # fmt: skip

    def update(self, done: float, text: str = "", force: bool = False) -> None:
        """`done` so far (absolute); `text` what a log line (or the bar's postfix) says besides it."""
        if self.bar is not None:
            self.bar.n = min(done, self.total) if self.total else done
            if text:
                self.bar.set_postfix_str(text, refresh=False)
            self.bar.refresh()
            return
        now = time.perf_counter()
        if (force or now - self.last_line >= self.every_s) and text != self.last_text:
            self.last_line, self.last_text = now, text
            print(f"[{self.tag}] {text}", flush=True)

    def close(self, text: str = "") -> None:
        """End the phase; `text` is its last line (printed once, on a terminal below the bar)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if text and text != self.last_text:
            self.last_text = text
            print(f"[{self.tag}] {text}", flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
