"""The plan a search decides, as one frozen record tree.

A `Plan` is what the search hands every later layer: the post-search check and `pipeline.simulate`
(through `simulator.build`), the report, the rate band and the launch files (`deployment`).
Nothing outside this package reads plan.json by key: `plan.schema` writes and reads its JSON form.

    Plan
    ├── islands: Island ...      GPU type and size, role, TP/DP/EP, batch, precision, the input-length
    │                            ranges it serves (RangeShare), what it is expected to do, its hosts
    ├── rates: Rates             the plan's rate and the diagnostic rates, each with its meaning (RATES)
    ├── model, cost              the model's dimensions and the one cost-settings record (with the SLOs)
    ├── workload, inventory      what it was planned for (the workload by name and by definition)
    ├── search, reference        how it was found: sampler, trials; the exact reference and the gap
    ├── band                     the rate's range over the calibration's uncertainty
    └── verification             the simulated check at the plan's rate

Invariants are checked when a record is made (`__post_init__`), so a Plan read back from a file is
as sound as one the search built: a bad value is a `PlanError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from costmodel.cli import UserError
from costmodel.roles import ROLES, Role

__all__ = ["ROLES", "Role"]  # re-exported by plan/__init__.py with the records
from costmodel.settings import CostSettings, Slo
from costmodel.specs import Model

MAX_DECODE_BATCH = 1024  # sequences per attention-DP rank; the island benchmark never plans more


class PlanError(UserError):
    """A plan (or plan.json) that cannot be right; the message names the field and the file."""


RATES = {
    "rate_req_s": "the plan's rate: requests/s the layout sustains with every island kept at a load whose "
    "queue meets the SLO percentiles, each island's caps set for the mix of lengths its routing gives it "
    "(docs/inner.md); without SLOs (slo=null), the fluid rate",
    "fluid_req_s": "diagnostic: the same layout and routing with every island busy all the time (no queueing, "
    "no SLO): an upper bound no deployment reaches",
    "searched_req_s": "the rate the search scored this layout with: each island's caps set for the whole "
    "workload's mix, the model the exact reference solves (the gap compares these two); rate_req_s is the "
    "same layout with each island's caps set for its own routed mix",
    "evaluated_req_s": "diagnostic: the plan's routing re-scored at every input length of the workload instead of "
    "each range's representative length, under the utilisation caps it was solved with",
    "output_tok_s": "output tokens/s at rate_req_s (the workload's mean output length)",
    "simulated_req_s": "objective goodput: the highest rate the simulator sustained within the SLOs for this "
    "layout in the search (bisection from rate_req_s; pipeline/planning/goodput.py)",
    "disaggregated_req_s": "comparison: the same layout with prefill and decode islands only (its rate_req_s "
    "where the plan was made without aggregated islands)",
    "with_aggregated_req_s": "comparison: the same layout with islands free to run aggregated engines too "
    "(costmodel.aggregated; its rate_req_s where the plan was made with them)",
    "bursty_req_s": "the mean rate the same islands in the same roles sustain under the workload's own arrivals "
    "(its trace's rate over time), each island's caps set so the SLO percentiles hold over the whole day "
    "(costmodel.queueing.modulated_cap; docs/inner.md); the rate to promise where traffic comes as the trace's "
    "did, checked against the simulator in docs/simulator.md; none without a trace, without SLOs, or with "
    "aggregated islands allowed (their SLO model is Poisson's)",
    "cache_free_req_s": "comparison: the same layout priced without its prefix caches (search.prefix_cache=false; "
    "rate_req_s prices each prefill island at its expected hit rates): what the caches add; none for a workload "
    "that names no prompt blocks",
}


def _whole(value: Any, what: str, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlanError(f"{what} must be a whole number >= {low}, got {value!r}")


def _real(value: Any, what: str, low: float | None = None, high: float | None = None) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not (ok and (low is None or value >= low) and (high is None or value <= high)):
        bounds = " and ".join(b for b in (low is not None and f">= {low:g}", high is not None and f"<= {high:g}") if b)
        raise PlanError(f"{what} must be a finite number{f' {bounds}' if bounds else ''}, got {value!r}")


def _optional_real(value: Any, what: str, low: float | None = None, high: float | None = None) -> None:
    if value is not None:
        _real(value, what, low, high)


@dataclass(frozen=True)
class RangeShare:
    """One input-length range an island serves: tokens [start, end), its share of the range's requests in
    the island's role (`fraction`) and the share of the island's time they take (`capacity`)."""

    start: int
    end: int
    fraction: float
    capacity: float

    def __post_init__(self) -> None:
        _whole(self.start, "start")
        _whole(self.end, "end", self.start + 1)
        _real(self.fraction, "fraction", 0.0, 1.0 + 1e-9)
        _real(self.capacity, "capacity", 0.0, 1.0 + 1e-6)


@dataclass(frozen=True)
class Hosts:
    """Where an island runs: host numbers of its GPU type (as report.md's node map numbers them), the first
    GPU it takes on the first of them, and how many GPUs a host of that type has."""

    node_gpus: int
    nodes: tuple[int, ...]
    first_gpu: int

    JSON_DERIVED: ClassVar = ("placement",)  # plan.json's `placement` beside them: `describe`, for a reader

    def __post_init__(self) -> None:
        _whole(self.node_gpus, "node_gpus", 1)
        if not self.nodes:
            raise PlanError("nodes is empty: an island runs on at least one host")
        for k, h in enumerate(self.nodes):
            _whole(h, f"nodes[{k}]")
        _whole(self.first_gpu, "first_gpu")
        if self.first_gpu >= self.node_gpus:
            raise PlanError(f"first_gpu {self.first_gpu} is not a GPU of a {self.node_gpus}-GPU host")

    def aligned(self, size: int) -> bool:
        """Whole hosts, or a slice of one host: what engines can be placed on."""
        if size % self.node_gpus == 0:
            return self.first_gpu == 0
        return self.node_gpus % size == 0 and self.first_gpu + size <= self.node_gpus

    def describe(self, gpu: str, size: int) -> str:
        """'H20 nodes 0-5', 'H20 node 6, GPUs 0-3', or a span that is not host-aligned, saying so."""
        n, first = self.node_gpus, self.first_gpu
        if size < n and n % size == 0:
            return f"{gpu} node {self.nodes[0]}, GPUs {first}-{first + size - 1}"
        many = len(self.nodes) > 1
        text = f"{gpu} node{'s' if many else ''} {self.nodes[0]}" + (f"-{self.nodes[-1]}" if many else "")
        if not self.aligned(size):
            text += f" (GPUs {first}-{(first + size - 1) % n} of the last: not host-aligned)"
        return text


def node_spans(hosts: Iterable[int]) -> str:
    """`0-124` or `3, 5-7`: host numbers as runs."""
    out: list[list[int]] = []
    for h in sorted(set(hosts)):
        if out and h == out[-1][1] + 1:
            out[-1][1] = h
        else:
            out.append([h, h])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


PRECISIONS = ("bf16", "fp8", "fp4", "mxfp4")  # mxfp4: a checkpoint's own 4-bit experts (GPT-OSS), on every GPU


@dataclass(frozen=True)
class Precision:
    """The number formats the cost model priced an island's weights in: dense layers and KV cache (`dense`),
    routed experts (`experts`)."""

    dense: str
    experts: str

    def __post_init__(self) -> None:
        for name in ("dense", "experts"):
            if getattr(self, name) not in PRECISIONS:
                raise PlanError(f"precision.{name} must be one of {list(PRECISIONS)}, got {getattr(self, name)!r}")

    def describe(self) -> str:
        return self.dense if self.experts == self.dense else f"{self.dense}, experts {self.experts}"


@dataclass(frozen=True)
class Island:
    """One homogeneous island of the plan.

    Prefill: `dp` replicas of `tp` GPUs, one engine whose expert-parallel group is the whole island.
    Decode: `dp` engines, each an expert-parallel group of `ep` GPUs with attention-DP ranks of `tp` GPUs;
    `batch` counts running sequences per rank. Aggregated: engines shaped as decode's, each prefilling and
    decoding its own requests in mixed steps (chunked prefill of `chunk_tokens` per attention rank a step).
    Idle: serves nothing (e.g. too small to hold the model)."""

    gpu: str
    size: int
    role: Role  # a plain word ("decode") is taken too
    tp: int
    dp: int
    ep: int
    batch: int
    precision: Precision
    cost_per_hour: float
    ranges: tuple[RangeShare, ...] = ()
    hosts: Hosts | None = None
    experts_per_gpu: int = 0  # routed experts a GPU of the EP group holds ...
    redundant_experts: int = 0  # ... with this many replicas added so they divide over the group
    traffic_share: float = 0.0  # share of all requests through the island in its role
    utilisation: float = 0.0  # share of its time it is busy at the plan's rate
    # the tokens a GPU of it handles a second at the plan's rate: a prefill island's prompt tokens (those its caches do
    # not hold), a decode island's output tokens, an aggregated one's both (0: not recorded)
    tokens_per_gpu_s: float = 0.0
    ttft_ms_expected: float | None = None  # prefill: the queueing model's TTFT at the SLO percentile
    tpot_ms_expected: float | None = None  # decode: its mean step over the mix it serves
    # two micro-batches overlapped (SGLang's two-batch overlap, vLLM's DBO), as the cost model priced the steps:
    # always for prefill; for decode, where that is faster at its batch (switch `overlap_chosen`), else one
    overlap: bool = True
    chunk_tokens: int = 0  # aggregated: prompt tokens per attention rank a mixed step prefills (0: not aggregated)
    # the ways its configuration lies outside the measured serving the cost model was fitted on (): inside; None:
    # not judged, the model was not fitted to measured serving (pipeline/planning/envelope.py)
    outside: tuple[str, ...] | None = None
    # prefill with prefix caches (a workload whose trace names its prompts' blocks): the share of its prompt tokens
    # its engines' caches are expected to hold, which its prefill was priced at (costmodel.reuse; None: not priced)
    cache_hit_expected: float | None = None

    JSON_DERIVED: ClassVar = ("ep_group",)  # plan.json's `ep_group` beside them, checked against `ep_group`

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, str) or not self.gpu:
            raise PlanError(f"gpu must name a GPU type, got {self.gpu!r}")
        _whole(self.size, "size", 1)
        if self.role not in ROLES:
            raise PlanError(f"role must be one of {list(ROLES)}, got {self.role!r}")
        object.__setattr__(self, "role", Role(self.role))
        _real(self.cost_per_hour, "cost_per_hour", 0.0)
        if not self.role.serving:
            if self.ranges:
                raise PlanError("an idle island serves no input-length ranges")
            return
        for name in ("tp", "dp", "ep", "batch"):
            _whole(getattr(self, name), name, 1)
        _whole(self.experts_per_gpu, "experts_per_gpu")  # 0 for a dense model (Plan checks it against the model)
        _whole(self.redundant_experts, "redundant_experts")
        if self.role == "prefill" and self.tp * self.dp != self.size:
            raise PlanError(f"prefill tp {self.tp} x dp {self.dp} must be the size {self.size}")
        if self.role.decodes and (self.ep * self.dp != self.size or self.ep % self.tp):
            raise PlanError(f"{self.role} ep {self.ep} x dp {self.dp} must be the size {self.size}, with tp "
                            f"{self.tp} dividing ep")  # fmt: skip
        if self.role.decodes and self.batch > MAX_DECODE_BATCH:
            raise PlanError(f"decode batch {self.batch} is over {MAX_DECODE_BATCH} sequences per rank, which no "
                            "plan of pipeline.search writes")  # fmt: skip
        if not self.ranges:
            raise PlanError(f"a {self.role} island serves at least one input-length range (ranges is empty)")
        if self.hosts is not None:
            h = self.hosts
            need = -(-(h.first_gpu + self.size) // h.node_gpus)
            if len(h.nodes) != need:
                raise PlanError(f"hosts: {self.size} GPUs from GPU {h.first_gpu} of {h.node_gpus}-GPU hosts take "
                                f"{need} host(s), not the {len(h.nodes)} in nodes")  # fmt: skip
        for a, b in zip(self.ranges, self.ranges[1:], strict=False):
            if b.start < a.end:
                raise PlanError(f"ranges overlap or are out of order: [{a.start}, {a.end}) then [{b.start}, {b.end})")
        _real(self.traffic_share, "traffic_share", 0.0, 1.0 + 1e-9)
        _real(self.utilisation, "utilisation", 0.0)
        _real(self.tokens_per_gpu_s, "tokens_per_gpu_s", 0.0)
        _optional_real(self.ttft_ms_expected, "ttft_ms_expected", 0.0)
        _optional_real(self.tpot_ms_expected, "tpot_ms_expected", 0.0)
        _optional_real(self.cache_hit_expected, "cache_hit_expected", 0.0, 1.0)
        _whole(self.chunk_tokens, "chunk_tokens")
        if self.role is Role.AGGREGATED and self.chunk_tokens < 1:
            raise PlanError("an aggregated island prefills at least one prompt token a step (chunk_tokens >= 1)")
        if not isinstance(self.overlap, bool):
            raise PlanError(f"overlap must be true or false, got {self.overlap!r}")

    @property
    def serving(self) -> bool:
        return self.role.serving

    @property
    def ep_group(self) -> int:
        """GPUs one engine spreads the routed experts over: the whole island for prefill, `ep` for decode and
        aggregated engines."""
        return self.ep if self.role.decodes else self.tp * self.dp

    @property
    def engines(self) -> int:
        """Engine instances of the island: one for prefill, `dp` for decode and aggregated, none when idle."""
        return 0 if not self.serving else self.dp if self.role.decodes else 1

    @property
    def attention_ranks(self) -> int:
        """Attention data-parallel ranks of one engine (each `tp` GPUs)."""
        return self.ep_group // self.tp

    @property
    def placement(self) -> str:
        return "-" if self.hosts is None else self.hosts.describe(self.gpu, self.size)


@dataclass(frozen=True)
class Rates:
    """The plan's rates in requests/s (`RATES` says what each means)."""

    rate_req_s: float
    fluid_req_s: float
    searched_req_s: float
    evaluated_req_s: float
    output_tok_s: float
    simulated_req_s: float | None = None
    disaggregated_req_s: float | None = None
    with_aggregated_req_s: float | None = None
    bursty_req_s: float | None = None
    cache_free_req_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("rate_req_s", "fluid_req_s", "searched_req_s", "evaluated_req_s", "output_tok_s"):
            _real(getattr(self, name), name, 0.0)
        for name in ("simulated_req_s", "disaggregated_req_s", "with_aggregated_req_s", "bursty_req_s",
                     "cache_free_req_s"):
            _optional_real(getattr(self, name), name, 0.0)

    @property
    def refined(self) -> bool:
        """Did routing each island its own mix change the rate from the one the search scored?"""
        return not math.isclose(self.rate_req_s, self.searched_req_s, rel_tol=1e-9, abs_tol=1e-9)


@dataclass(frozen=True)
class InventoryInfo:
    name: str
    gpus: tuple[tuple[str, int], ...]  # (GPU type, count)
    cost_per_hour: float

    def __post_init__(self) -> None:
        for gpu, n in self.gpus:
            _whole(n, f"gpus.{gpu}", 1)
        _real(self.cost_per_hour, "cost_per_hour", 0.0)


@dataclass(frozen=True)
class SearchInfo:
    """How the plan was found."""

    objective: str
    sampler: str
    generator: str
    trials: int
    failed: int
    rejected: int
    complete: bool
    wall_s: float
    robust: bool = False

    def __post_init__(self) -> None:
        for name in ("trials", "failed", "rejected"):
            _whole(getattr(self, name), name)
        _real(self.wall_s, "wall_s", 0.0)


REFERENCE_AHEAD = 1e-4  # the reference's own layout scoring this much more than the plan's is pointed out


@dataclass(frozen=True)
class Reference:
    """The exact reference of the search's model, and the plan's gap to it.

    `gap`: 1 - the plan's score in the search's model / the reference's optimum (or, where the reference
    stopped at its time limit, `gap_is_bound`, / its proven bound `bound_req_s`: the true gap is at most this).
    `layout_ahead`: how much more the reference's own layout scores than the plan's (0.0035: 0.35 %)."""

    optimum_req_s: float | None
    rate_per_dollar: float | None
    bound_req_s: float | None
    gap: float | None
    gap_is_bound: bool = False
    layout_ahead: float | None = None
    lost_hosts: int = 0  # the optimum with this many hosts lost (search.reference=spare; 0: every host up)

    def __post_init__(self) -> None:
        _whole(self.lost_hosts, "lost_hosts")
        for name in ("optimum_req_s", "rate_per_dollar", "bound_req_s", "gap", "layout_ahead"):
            _optional_real(getattr(self, name), name)

    def gap_text(self) -> str:
        """'gap 0.84%', 'gap <= 0.84%' where the reference only bounds the optimum, '' without a gap."""
        if self.gap is None:
            return ""
        gap = 0.0 if abs(self.gap) < 5e-7 else self.gap  # (the optimum itself, to rounding: no "-0.00%")
        return f"gap {'<= ' if self.gap_is_bound else ''}{gap:.2%}"

    @property
    def points_ahead(self) -> bool:
        return self.layout_ahead is not None and self.layout_ahead > REFERENCE_AHEAD


@dataclass(frozen=True)
class Sizing:
    """search.objective=min_cost: the plan is the cheapest fleet found, of the inventory's GPUs (its counts upper
    bounds, each type at its $/h), that serves `demand_req_s` within the SLOs in the search's model; what the
    exact MILPs say of the same question (None: not solved)."""

    demand_req_s: float
    inventory_cost_per_hour: float  # every GPU of the inventory
    most_req_s: float | None = None  # the most the whole inventory serves (exact max_rate optimum, or its bound)
    cheapest_per_hour: float | None = None  # the exact cheapest fleet's $/h
    cheapest_is_bound: bool = False  # that MILP stopped at its time limit: cheapest_per_hour is a lower bound
    mixes: tuple[tuple[str, float], ...] = ()  # each GPU mix that serves the demand alone, and its exact cheapest $/h
    short_mixes: tuple[str, ...] = ()  # the mixes that cannot serve it alone
    searched_per_hour: float | None = None  # the fleet the trials found, sized in their model ($/h; the gap is its):
    # where it holds less than the demand as the plan states rates, the plan's fleet is sized again and costs more
    hosts_lost: int = 0  # the fleet serves the demand with any this many hosts lost (search.spare_hosts)
    reference_hosts_lost: int = 0  # ... and the exact answers with this many (1: search.reference=spare)

    def __post_init__(self) -> None:
        _real(self.demand_req_s, "demand_req_s", 0.0)
        _real(self.inventory_cost_per_hour, "inventory_cost_per_hour", 0.0)
        _optional_real(self.most_req_s, "most_req_s", 0.0)
        _optional_real(self.cheapest_per_hour, "cheapest_per_hour", 0.0)
        _optional_real(self.searched_per_hour, "searched_per_hour", 0.0)
        for mix, cost in self.mixes:
            _real(cost, f"mixes.{mix}", 0.0)


@dataclass(frozen=True)
class Band:
    """The plan's rate under draws of the calibration's factors: 10th, 50th and 90th percentile."""

    p10_req_s: float
    p50_req_s: float
    p90_req_s: float
    draws: int
    calibration: str
    method: str = "the layout re-planned under each draw of the calibration's factors (pipeline/planning/band.py)"

    def __post_init__(self) -> None:
        for name in ("p10_req_s", "p50_req_s", "p90_req_s"):
            _real(getattr(self, name), name, 0.0)
        if not self.p10_req_s <= self.p50_req_s <= self.p90_req_s:
            raise PlanError("the band's percentiles must be ordered p10 <= p50 <= p90")
        _whole(self.draws, "draws", 1)


@dataclass(frozen=True)
class HostLoss:
    """The plan with one host gone (host `node` of `gpu`, as report.md's node map numbers them): its islands on
    that host stop (`islands`, indices into the plan's; an engine spanning several hosts stops whole) and the
    router re-solves its shares over the islands left, each in the role and engine it runs (no re-launch).
    `simulated_req_s`: the rate the simulator sustains within the SLOs so (None: not simulated)."""

    gpu: str
    node: int
    islands: tuple[int, ...]
    rate_req_s: float
    simulated_req_s: float | None = None

    def __post_init__(self) -> None:
        _whole(self.node, "node")
        for k, i in enumerate(self.islands):
            _whole(i, f"islands[{k}]")
        _real(self.rate_req_s, "rate_req_s", 0.0)
        _optional_real(self.simulated_req_s, "simulated_req_s", 0.0)


@dataclass(frozen=True)
class HostLosses:
    """The plan's rate with each host that runs a serving island gone in turn (pipeline/planning/failures.py);
    `worst` is the one a team should plan spare capacity for."""

    losses: tuple[HostLoss, ...]
    rate_req_s: float  # the plan's rate with every host up, for the ratios
    spare_hosts: int = 0  # search.spare_hosts=K planned for: the worst K hosts lost at once, below (0: not asked)
    spare_nodes: tuple[tuple[str, int], ...] = ()  # those K hosts (GPU, node)
    spare_req_s: float | None = None  # the rate with them lost

    JSON_DERIVED: ClassVar = ("worst",)  # plan.json names the worst host beside the list, for a reader

    def __post_init__(self) -> None:
        if not self.losses:
            raise PlanError("losses is empty: a plan that serves runs on at least one host")
        _real(self.rate_req_s, "rate_req_s", 0.0)
        _whole(self.spare_hosts, "spare_hosts")
        _optional_real(self.spare_req_s, "spare_req_s", 0.0)
        if (self.spare_req_s is None) != (self.spare_hosts == 0):
            raise PlanError("spare_req_s is the rate with spare_hosts hosts lost: give both or neither")

    @property
    def worst(self) -> HostLoss:
        return min(self.losses, key=lambda h: (h.rate_req_s, h.gpu, h.node))


@dataclass(frozen=True)
class Replan:
    """How this plan was reached from a running one (search.from_plan; pipeline/planning/replan.py): the moves
    (a line each), the islands that run on unchanged (`kept`, indices into this plan's islands: no launch files),
    the hosts re-launched, and this plan's rate beside the best plan from scratch, both in the search's model."""

    from_plan: str
    moves: tuple[str, ...]
    kept: tuple[int, ...]
    hosts_relaunched: int
    max_moves: int
    searched_req_s: float
    scratch_req_s: float | None = None

    def __post_init__(self) -> None:
        for k, i in enumerate(self.kept):
            _whole(i, f"kept[{k}]")
        _whole(self.hosts_relaunched, "hosts_relaunched")
        _whole(self.max_moves, "max_moves")
        _real(self.searched_req_s, "searched_req_s", 0.0)
        _optional_real(self.scratch_req_s, "scratch_req_s", 0.0)


@dataclass(frozen=True)
class Bursts:
    """The mean rate the plan sustains within its SLOs under its workload's own arrivals (search.arrivals=workload;
    pipeline/planning/check.py `bursts`), each simulation one whole cycle of the workload's arrival profile so the
    SLO percentiles are the day's: `rate_req_s` (0: none of the rates tried held). `peak_to_mean` (q): the
    workload's rate per profile bin (1 s) over its mean that `percentile` % of its requests arrive at or below;
    `estimate_req_s` = the stated rate / q; the first probe is the plan's `rates.bursty_req_s` (the queueing
    model's rate under these arrivals) where it has one, else `estimate_req_s`. At
    `rate_req_s`: the share of requests within the SLOs and their percentiles over the day; `why_above`: why the
    lowest rate above it that was tried broke."""

    rate_req_s: float
    estimate_req_s: float
    peak_to_mean: float
    percentile: float
    day_s: float
    slo_attainment: float
    ttft_ms_p99: float
    tpot_ms_p99: float
    why_above: str
    probes: int
    sim_wall_s: float
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rate_req_s", "estimate_req_s", "day_s", "sim_wall_s"):
            _real(getattr(self, name), name, 0.0)
        _real(self.peak_to_mean, "peak_to_mean", 0.0)
        _whole(self.probes, "probes")


@dataclass(frozen=True)
class Window:
    """One simulation of the check at the plan's rate: its requests and measuring window."""

    requests: int
    window_s: float
    e2e_ms_p99: float
    ramp_deficit: float
    offered_req_s: float
    throughput_req_s: float


@dataclass(frozen=True)
class Verification:
    """The plan simulated request by request at its rate (pipeline/planning/check.py).

    `sustained`: throughput kept up and the SLO percentiles held (else `why_not`); where they did not,
    `sustained_req_s` is the highest rate below the stated one the simulator sustains (0: none of those
    tried, down to half the stated rate) and `holds_at_0_95` whether 0.95 x stated held.
    `steady_state`: why the measuring window may be too short for a verdict ("" when it is not).
    `precision`: how far the simulated rate may stray by chance (relative standard error of the window's
    heavy-tailed answers and of its Poisson arrivals)."""

    offered_req_s: float
    throughput_req_s: float
    simulated_over_stated: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_p99: float
    ttft_ms_at_slo: float
    tpot_ms_at_slo: float
    slo_attainment: float
    sustained: bool
    why_not: str
    steady_state: str
    requests: int
    sim_wall_s: float
    slo: str
    sustained_req_s: float
    sustained_over_stated: float
    holds_at_0_95: bool | None = None
    windows: tuple[Window, ...] = ()
    precision: float = 0.0  # the simulated rate's relative standard error: the window's answers and arrivals
    # the share of prompt tokens the engines' prefix caches found, in all and per serving island (its index in the
    # plan's serving islands); None: no prefix caches (a workload that names no prompt blocks)
    cache_hit_rate: float | None = None
    cache_hit_rates: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Plan:
    """A plan: islands, routing, rates, and what it was made with and for (module docstring)."""

    islands: tuple[Island, ...]
    rates: Rates
    model: Model
    cost: CostSettings
    workload: str
    status: str = "optimal"
    inventory: InventoryInfo | None = None
    search: SearchInfo | None = None
    reference: Reference | None = None
    band: Band | None = None
    verification: Verification | None = None
    host_losses: HostLosses | None = None
    replan: Replan | None = None
    bursts: Bursts | None = None
    sizing: Sizing | None = None  # search.objective=min_cost: the demand it is the cheapest fleet for
    notes: tuple[str, ...] = ()
    workload_spec: str = ""  # the workload's definition as planned (canonical JSON of its conf mapping; "": unknown)

    # what plan.json writes beside the record for a reader (plan/schema.py), not read back
    JSON_DERIVED: ClassVar = ("rate_meanings", "cost_per_hour", "rate_per_dollar", "prefill_islands", "decode_islands")

    def __post_init__(self) -> None:
        if not self.islands:
            raise PlanError("islands is empty: a plan has at least one island")
        experts = self.model.n_routed_experts
        for k, isl in enumerate(self.islands):
            if not isl.serving:
                continue
            group = isl.ep_group
            if isl.experts_per_gpu != -(-experts // group) or isl.redundant_experts != isl.experts_per_gpu * group - \
                    experts:  # fmt: skip
                raise PlanError(
                    f"islands[{k}]: an EP group of {group} GPUs holds {experts} routed experts as "
                    f"{-(-experts // group)} per GPU with {-(-experts // group) * group - experts} redundant, not "
                    f"{isl.experts_per_gpu} with {isl.redundant_experts}"
                )
        serving = [isl for isl in self.islands if isl.serving]
        roles = {isl.role for isl in serving}
        if self.rates.rate_req_s > 0 and not ({"prefill", "decode"} <= roles or "aggregated" in roles):
            raise PlanError(f"a rate of {self.rates.rate_req_s:g} req/s needs a prefill and a decode island, or an "
                            "aggregated one")  # fmt: skip
        if not isinstance(self.workload, str):
            raise PlanError(f"workload must be a name, got {self.workload!r}")
        if self.workload_spec and not isinstance(self.spec_of_workload, dict):
            raise PlanError("workload_spec must be the workload's conf mapping (an object)")
        self._check_hosts()

    def _check_hosts(self) -> None:
        """No GPU of a host is in two islands, and, where the plan records its inventory, its islands take no more
        GPUs of a type than the inventory has."""
        taken: dict[tuple[str, int, int], int] = {}
        if self.inventory is not None:
            has = dict(self.inventory.gpus)
            for gpu in {isl.gpu for isl in self.islands}:
                used = sum(isl.size for isl in self.islands if isl.gpu == gpu)
                if used > has.get(gpu, 0):
                    raise PlanError(f"its islands take {used} {gpu}, but its inventory has {has.get(gpu, 0)}")
        for k, isl in enumerate(self.islands):
            h = isl.hosts
            if h is None:
                continue
            for slot in range(h.first_gpu, h.first_gpu + isl.size):
                gpu = (isl.gpu, h.nodes[slot // h.node_gpus], slot % h.node_gpus)
                if gpu in taken:
                    raise PlanError(f"islands[{k}] and islands[{taken[gpu]}] both run on {gpu[0]} host {gpu[1]}, GPU "
                                    f"{gpu[2]}: a GPU serves one island")  # fmt: skip
                taken[gpu] = k

    @property
    def spec_of_workload(self) -> dict[str, Any] | None:
        """The workload's conf mapping as it was planned (None: the plan does not record it)."""
        import json

        return json.loads(self.workload_spec) if self.workload_spec else None

    # what follows from the islands ----------------------------------------------------------------

    @property
    def serving(self) -> tuple[Island, ...]:
        return tuple(isl for isl in self.islands if isl.serving)

    @property
    def extrapolated(self) -> tuple[Island, ...] | None:
        """The serving islands outside the measured serving the cost model was fitted on (`Island.outside`); None
        where the plan was not judged (a model not fitted to measured serving)."""
        if all(isl.outside is None for isl in self.serving):
            return None
        return tuple(isl for isl in self.serving if isl.outside)

    @property
    def serves(self) -> bool:
        """Can the plan serve a request at all (a rate, a prefill and a decode island)?"""
        return self.rates.rate_req_s > 0

    @property
    def rate_req_s(self) -> float:
        return self.rates.rate_req_s

    @property
    def cost_per_hour(self) -> float:
        """$/h of the islands that serve (an island left idle need not be rented)."""
        return float(sum(isl.cost_per_hour for isl in self.serving))

    @property
    def rate_per_dollar(self) -> float:
        cost = self.cost_per_hour
        return self.rates.rate_req_s / cost if cost > 0 else 0.0

    @property
    def usd_per_m_output_tokens(self) -> float:
        """$ per million output tokens at the plan's rate."""
        tok_s = self.rates.output_tok_s
        return self.cost_per_hour / (tok_s * 3600.0) * 1e6 if tok_s > 0 else float("nan")

    def count(self, role: str) -> int:
        return sum(isl.role == role for isl in self.islands)

    @property
    def slo(self) -> Slo:
        """The latency targets the plan was made for (its cost settings')."""
        return self.cost.slo

    @property
    def profile_name(self) -> str:
        return self.cost.profile.name

