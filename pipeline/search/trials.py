"""A search's trials as they finish: its run folder, the journal, MLflow's child runs, the best so far, the gap
to the exact reference and the progress line (`SearchRun`). The trials themselves run elsewhere
(`pipeline.search.tune.driver` under Ray Tune); every finished one comes back through `add_batch`.

Every finished trial is journalled before anything else, so a logging failure (an MLflow store locked or
gone) can neither lose a trial nor turn it into a failed one: its child run is logged once the store
answers again, or on resume (which also logs any journalled trial MLflow does not have). Child runs are
written by a thread beside the trials (`background_logging`), so MLflow's ~15 ms per run does not hold up
the next batch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.checks import make_dir
from pipeline.errors import ConfigError
from pipeline.planning.planner import layout_id
from pipeline.records.journal import Journal
from pipeline.records.progress import Progress
from pipeline.records.tracking import Child
from pipeline.search.settings import Settings
from pipeline.search.trial import GOODPUT_METRICS, METRICS, OK, Context
from solvers.exact import ExactResult, SizingOptima


class SearchRun:
    """One search: its folder, journal, MLflow runs, progress line, and the Ray Tune loop."""

    def __init__(self, settings: Settings, ctx: Context, tracker: Any) -> None:
        self.s, self.ctx, self.tracker = settings, ctx, tracker
        self.dir = self._run_dir()
        self.journal = Journal(self.dir / "trials.jsonl")
        self.records = self.journal.load()
        self.resumed = len(self.records)
        self.best: dict[str, Any] | None = max(
            (r for r in self.records if r["status"] in OK), key=lambda r: r["score"], default=None
        )
        self.ref: ExactResult | None = None
        self.sizing: SizingOptima | None = None  # objective min_cost: the exact answers for the demand
        self.searched_fleet: float | None = None  # ... and the $/h of the fleet the trials found, in their model
        self.replanned: Any = None  # search.from_plan: the re-plan found (pipeline.planning.replan.Replanned)
        self.unlogged: list[dict[str, Any]] = []  # finished trials MLflow has not taken yet
        self.fatal: OSError | None = None  # why the journal could not be written: the search stops asking for trials
        self.store_warned = False  # one console line when the store stops answering, not one per trial
        self.t0 = time.perf_counter()
        self.bar: Progress | None = None
        self.closed = False
        self._logging = threading.Lock()  # one writer of child runs at a time
        self._logger: threading.Thread | None = None  # logs child runs while Tune runs (`background_logging`)
        self._wake = threading.Event()
        n_polish = round(settings.search.polish * settings.search.trials) if settings.mode == "search" else 0
        self.polish_from = settings.search.trials - n_polish if n_polish else None  # the trial polish starts at

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks, and with them this run, into its experiment state; locks do not pickle
        return {k: v for k, v in self.__dict__.items() if k not in ("_logging", "_logger", "_wake")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _logging=threading.Lock(), _logger=None, _wake=threading.Event())

    def _run_dir(self) -> Path:
        root = self.s.run_root
        if self.s.search.resume:  # a run cut short may have written any of its files, or all of them whole
            made = ("trials.jsonl", "state.json", "config.json")
            runs = sorted(p for p in root.glob("*") if any((p / f).exists() for f in made)) if root.exists() else []
            if not runs:
                raise ConfigError(f"search.resume=true: no earlier run of this exact config under {root}")
            return runs[-1]
        d = root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        make_dir(d, "out_root", root.parent)
        return d

    # trials -------------------------------------------------------------------------------------

    def add_batch(self, trials: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, str | None]]) -> None:
        """Finished trials, in order: (params, result, or the error that stopped the trial). A batch
        comes back together, and is journalled in one write."""
        recs = [self._record(len(self.records) + k, *trial) for k, trial in enumerate(trials)]
        try:
            self.journal.extend(recs)  # first: what is journalled is done, whatever happens next
        except OSError as err:  # a full disk, the run folder gone: no more trials; the search ends and says why
            self.fatal = self.fatal or err
            return
        for rec in recs:
            self.records.append(rec)
            if rec["status"] in OK and (self.best is None or rec["score"] > self.best["score"]):
                self.best = rec
            self.unlogged.append(rec)
            if rec["status"] == "error":
                print(f"[search] trial {rec['trial']} failed: {rec['note']}", flush=True)
        if self._logger is not None:
            self._wake.set()  # the logger thread takes them, off this loop
        else:
            self.log_trials()
        self.progress()

    def _record(
        self, idx: int, params: Mapping[str, Any], result: Mapping[str, Any] | None, error: str | None
    ) -> dict[str, Any]:
        rec: dict[str, Any] = {"trial": idx, "iteration": idx // self.s.search.batch, "params": dict(params)}
        if error is not None:
            rec.update(dict.fromkeys(METRICS, 0.0), status="error", islands="", note=error)
        else:
            assert result is not None
            rec.update({k: result.get(k) for k in (*METRICS, "status", "islands", "note", "node", "pid")})
            rec.update({k: result[k] for k in GOODPUT_METRICS if k in result})
        # a goodput trial's score is simulated; its gap is that of its analytic rate to the analytic optimum
        rec["gap"] = self.gap(rec["rate_req_s"] if self.s.search.objective == "goodput" else rec["score"])
        return rec

    def log_trials(self) -> bool:
        """Log the trials MLflow has not taken yet as child runs; False while the store does not answer."""
        with self._logging:
            return self._log_trials()

    def _log_trials(self) -> bool:
        while self.unlogged:
            chunk = self.unlogged[: 256 if self.tracker.bulk else 1]  # a bulk store takes them all or none
            try:
                self.tracker.children([self._child(rec) for rec in chunk])
            except Exception as err:  # the store is locked or gone: the journal has the trials
                if not self.store_warned:
                    print(f"[search] MLflow did not take trial {chunk[0]['trial']} ({_short(err)}); "
                          "logging it when the store answers again", flush=True)  # fmt: skip
                    self.store_warned = True
                return False
            del self.unlogged[: len(chunk)]
        return True

    @staticmethod
    def _child(rec: Mapping[str, Any]) -> Child:
        return Child(
            trial_run_name(rec["trial"]),
            {**rec["params"], "layout_id": layout_id(rec["islands"]), "status": rec["status"]},
            {k: rec[k] for k in (*METRICS, *GOODPUT_METRICS, "gap") if isinstance(rec.get(k), (int, float))},
            failed=rec["status"] == "error",
            tags={
                "islands": rec["islands"] or "-",
                "description": f"Trial {rec['trial']}: {rec['status']}; islands {rec['islands'] or '-'}"
                + (f"; {rec['note']}" if rec.get("note") else ""),
            },
        )

    @contextlib.contextmanager
    def background_logging(self) -> Iterator[None]:
        """Child runs logged by a thread while the trials run; every queued one is logged (or left for
        `log_trials` to retry) by the time this exits."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                self._wake.wait(1.0)  # a new trial, or a second to retry a store that did not answer
                self._wake.clear()
                self.log_trials()

        self._logger = threading.Thread(target=loop, name="mlflow-children", daemon=True)
        self._logger.start()
        try:
            yield
        finally:
            stop.set()
            self._wake.set()
            self._logger.join()
            self._logger = None
            self.log_trials()

    def reconcile(self, logged: set[str]) -> None:
        """On resume: queue every journalled trial whose child run MLflow does not have."""
        self.unlogged = [r for r in self.records if trial_run_name(r["trial"]) not in logged]

    @property
    def gap_is_bound(self) -> bool:
        """Is `gap` measured against a bound on the optimum, an upper bound on the true gap? Where the reference
        stopped at its time limit (its proven bound), and with search.spare_hosts where the reference plans with every
        host up (no layout keeps more with hosts lost; search.reference=spare solves the optimum with one lost)."""
        if self.ref is None:
            return False
        o = self.s.search
        return (o.spare_hosts > 0 and not self.ref.lost_hosts) or (self.ref.status == "feasible"
                                                                    and o.objective in ("max_rate", "min_cost"))

    def reference_score(self) -> float:
        """The exact reference's score, in the trials' units (or its bound's, `gap_is_bound`); nan without one."""
        if self.ref is None or self.s.search.objective == "thesis":
            return float("nan")
        if self.s.search.objective == "min_cost":  # the score is demand / $/h: the gap is 1 - cheapest / cost
            cheapest = self.ref.bound if self.ref.status == "feasible" else self.ref.cost_per_hour
            return (self.s.search.demand_req_s or 0.0) / cheapest if cheapest > 0 else 0.0
        if self.ref.status == "feasible" and self.s.search.objective == "max_rate":
            return self.ref.bound
        return self.ref.rate_per_dollar if self.s.search.objective == "rate_per_dollar" else self.ref.rate_req_s

    def gap(self, score: float) -> float:
        ref = self.reference_score()
        return 1.0 - score / ref if ref > 0 else float("nan")

    def gap_text(self, gap: float) -> str:
        """'gap 0.84%', or 'gap <= 0.84%' where the reference only bounds the optimum."""
        return f"gap {'<= ' if self.gap_is_bound else ''}{gap:.2%}" if gap == gap else ""

    def progress(self, force: bool = False) -> None:
        """Trials done, the best score and its gap: a bar on a terminal, a line every 2 s in a log."""
        if self.bar is None:
            self.bar = Progress("search", "trials", self.s.search.trials, "trials")
        now = time.perf_counter()
        done_here = len(self.records) - self.resumed
        rate = done_here / max(now - self.t0, 1e-9)
        best = self.best["score"] + 0.0 if self.best else 0.0
        unit = "req/s per $/h" if self.s.search.objective == "rate_per_dollar" else "req/s"
        gap = self.gap(best) if self.s.search.objective != "goodput" else float("nan")  # simulated vs analytic: no gap
        gap_txt = f"  {self.gap_text(gap)}" if gap == gap else ""
        failed = sum(r["status"] == "error" for r in self.records)
        shown = f"{best:.4g} {unit}"
        if self.s.search.objective == "min_cost":  # the fleet's $/h, not the score
            shown = f"${self.best['cost_per_hour']:,.2f}/h" if self.best else "none serves the demand yet"
        text = (f"{len(self.records)}/{self.s.search.trials} trials  best {shown}{gap_txt}  "
                f"{rate:.2f} trials/s{f'  {failed} failed' if failed else ''}")  # fmt: skip
        if force or len(self.records) >= self.s.search.trials:
            # the last state once, with the rate it ended at (not again with the time of later work)
            if not self.closed:
                self.bar.update(len(self.records))
                self.bar.close(text)
                self.closed = True
            return
        self.bar.update(len(self.records), text)
        if self.polish_from is not None and len(self.records) == self.polish_from:
            print(f"[search] polish: trials {self.polish_from + 1}-{self.s.search.trials} step from the best layout so "
                  "far to its neighbours", flush=True)  # fmt: skip

    # the loop -----------------------------------------------------------------------------------


def trial_run_name(idx: int) -> str:
    return f"trial-{idx:04d}"


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:160]}"
