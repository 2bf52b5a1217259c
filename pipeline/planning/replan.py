"""Re-plan with few moves: from a running plan to the best plan within `max_moves` changed islands.

After a host is lost (or added) or the workload changes, a plan made from scratch may move every island. An
on-call engineer wants the best plan reachable by re-launching few of them. Starting from the old plan's
islands that still have all their hosts (each kept where it runs, in the role its engines run), a move is:

- **add** an island of k free hosts of one GPU type (its role chosen by the solve);
- **flip** a kept island to the other role (its engines re-launched);
- **drop** a kept island (its engines stopped, its hosts freed for an add);
- **resize** a kept island to k hosts out of its own and the free ones (re-launched, its role chosen anew).

A move changes one island; `max_moves` bounds the islands changed, and every plan found says how many hosts
it re-launches. The search over moves is a beam search (`BEAM` states a depth); each state is scored by the
max_rate of its islands with the kept and flipped ones in their roles and the added ones free
(`solvers/spare.py` with no loss scenario: the search's model, whole-mix load caps), or, for a plan made for lost
hosts (`spare`: a fleet planned for one), by its rate with its worst hosts lost first and that one second. Added
islands take whole free hosts (no island smaller than a host is added), and never a host another model's island
holds (`busy`: a fleet)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from pipeline.planning.failures import loss_scenarios
from pipeline.planning.planner import Layout, Planner
from plan import Hosts, Island, Plan, Role, node_spans
from solvers.spare import spare_roles

BEAM = 12  # states kept at each depth of the search over moves
HOST_COUNTS = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # hosts an added island may take (and all the free ones)


@dataclass(frozen=True)
class Piece:
    """An island of a re-plan: where it runs, its role if fixed (None: chosen by the solve), where it came from."""

    gpu: str
    size: int
    hosts: Hosts
    role: str | None
    origin: int | None  # the old plan's island it keeps (None: added)
    flipped: bool = False


@dataclass(frozen=True)
class Replanned:
    """The best plan found: its islands (in Layout order) and roles, its rate in the search's model, and the
    moves that reach it (each a line, e.g. 'add 4 x H20 hosts 12-15')."""

    pieces: tuple[Piece, ...]
    roles: tuple[str, ...]
    searched_req_s: float
    moves: tuple[str, ...]
    hosts_relaunched: int

    @property
    def layout(self) -> Layout:
        return Layout(tuple((p.gpu, p.size) for p in self.pieces))

    @property
    def kept(self) -> tuple[int, ...]:
        """Indices (in `pieces`) of the islands that run on, unchanged."""
        return tuple(i for i, p in enumerate(self.pieces) if p.origin is not None and not p.flipped)


def hosts_now(old: Plan, counts: Mapping[str, int], node_gpus: Mapping[str, int],
              lost: Sequence[tuple[str, int]]) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """The hosts of each GPU type the new inventory has: the old plan's (0 .. its GPUs / host - 1) without `lost`,
    then the highest-numbered ones dropped, or new ones numbered after the old ones, until the count matches."""
    if old.inventory is not None:
        old_hosts = {g: -(-n // node_gpus.get(g, n or 1)) for g, n in old.inventory.gpus}
    else:  # a plan without its inventory: the hosts its islands run on
        old_hosts = {}
        for isl in old.islands:
            if isl.hosts is not None:
                old_hosts[isl.gpu] = max(old_hosts.get(isl.gpu, 0), max(isl.hosts.nodes) + 1)
    out = {}
    for gpu, n in counts.items():
        per = node_gpus[gpu]
        have = [h for h in range(old_hosts.get(gpu, 0)) if (gpu, h) not in set(lost)]
        want = -(-n // per)
        nxt = old_hosts.get(gpu, 0)
        while len(have) < want:
            have.append(nxt)
            nxt += 1
        out[gpu] = tuple(sorted(have)[:want])
    return out


def replan(
    planner: Planner,
    old: Plan,
    hosts: Mapping[str, Sequence[int]],
    min_island: Mapping[str, int],
    max_moves: int,
    *,
    time_limit_s: float,
    backend: str = "AUTO",
    max_hosts: int | None = None,
    busy: Collection[tuple[str, int]] = (),
    spare: int = 0,
) -> Replanned:
    """The best plan within `max_moves` changed islands of `old` on the hosts `hosts` (per GPU type), and, with
    `max_hosts`, at most that many hosts re-launched. `busy`: hosts (GPU, host) of `hosts` that other models' islands
    share with this plan's, never free for an island added here even where this plan's own leave them (a fleet).
    `spare` > 0: each state scored by its rate with its worst `spare` hosts lost (`solvers/spare.py` over its
    islands' hosts, its roles the ones that keep the most then), as a plan made for lost hosts is (a fleet planned
    for one)."""
    kept = []
    for i, isl in enumerate(old.islands):
        if isl.serving and isl.hosts is not None and isl.gpu in planner.gpus and \
                set(isl.hosts.nodes) <= set(hosts.get(isl.gpu, ())):  # fmt: skip
            kept.append(Piece(isl.gpu, isl.size, isl.hosts, isl.role if isl.role.disaggregated else None, i))
    scored: dict[tuple[object, ...], tuple[tuple[float, float], tuple[str, ...]]] = {}

    def solve(pieces: tuple[Piece, ...], lost: bool, roles: Sequence[str | None]) -> tuple[float, tuple[str, ...]]:
        islands = tuple((p.gpu, p.size) for p in pieces)
        prob = planner.problem(Layout(islands), "max_rate")
        downs = [d for _, d in loss_scenarios(islands, [p.hosts for p in pieces], spare)] if lost else []
        r = spare_roles(prob.prefill_req_s, prob.decode_req_s, prob.p, downs, time_limit_s, backend, roles)
        return r.rate_req_s, r.roles

    def score(pieces: tuple[Piece, ...]) -> tuple[tuple[float, float], tuple[str, ...]]:
        """(the state's worth, its roles): (its rate, 0), or with `spare` (its rate with its worst hosts lost, its
        rate with every host up: the tie-break, e.g. where no state keeps anything with a host lost)."""
        key = tuple((p.gpu, p.size, p.hosts.nodes, p.role) for p in pieces)
        if key not in scored:
            if not pieces:
                scored[key] = ((0.0, 0.0), ())
            else:
                up, up_roles = solve(pieces, False, [p.role for p in pieces])
                if not spare:
                    scored[key] = ((up, 0.0), up_roles)
                else:
                    down, down_roles = solve(pieces, True, [p.role for p in pieces])
                    scored[key] = ((down, up), down_roles if down > 0 else up_roles)
        return scored[key]

    def potential(pieces: tuple[Piece, ...]) -> tuple[float, float]:
        """The worth with every role free: what a state may still reach by flips (breaks ties, e.g. at 0)."""
        return score(tuple(replace(p, role=None) for p in pieces))[0]

    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] > b[0] * (1 + 1e-9) or (a[0] >= b[0] * (1 - 1e-9) and a[1] > b[1] * (1 + 1e-9))

    start = _ordered(kept)
    beam = [(start, ())]
    best = (score(start)[0], start, ())
    for _ in range(max_moves):
        children: dict[tuple[object, ...], tuple[tuple[Piece, ...], tuple[str, ...]]] = {}
        for pieces, moves in beam:
            for child, move in _moves(planner, pieces, hosts, min_island, busy):
                if max_hosts is not None and _relaunched(child) > max_hosts:
                    continue
                children.setdefault(tuple((p.gpu, p.size, p.hosts.nodes, p.role, p.origin) for p in child),
                                    (child, (*moves, move)))  # fmt: skip
        if not children:
            break
        ranked = sorted(children.values(), key=lambda c: (tuple(-x for x in score(c[0])[0]),
                                                          tuple(-x for x in potential(c[0]))))  # fmt: skip
        beam = ranked[:BEAM]
        # of the states worth as much as the best of this depth, the one that re-launches the fewest hosts
        top = min((c for c in beam if not better(score(beam[0][0])[0], score(c[0])[0])),
                  key=lambda c: _relaunched(c[0]))  # fmt: skip
        if better(score(top[0])[0], best[0]):
            best = (score(top[0])[0], top[0], top[1])
    _, pieces, moves = best
    roles = score(pieces)[1]
    rate = solve(pieces, False, roles)[0] if pieces else 0.0  # its rate with every host up, in those roles
    return Replanned(pieces, roles, rate, moves, _relaunched(pieces))


def _relaunched(pieces: Sequence[Piece]) -> int:
    return sum(len(p.hosts.nodes) for p in pieces if p.origin is None or p.flipped)


def _ordered(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    """In Layout's canonical order (GPU, then size descending), then by host."""
    return tuple(sorted(pieces, key=lambda p: (p.gpu, -p.size, p.hosts.nodes)))


def _moves(
    planner: Planner, pieces: tuple[Piece, ...], hosts: Mapping[str, Sequence[int]], min_island: Mapping[str, int],
    busy: Collection[tuple[str, int]] = (),
) -> list[tuple[tuple[Piece, ...], str]]:
    """Every state one move from `pieces`, with the move's line (`busy`: hosts never free)."""
    used = {(p.gpu, h) for p in pieces for h in p.hosts.nodes} | set(busy)
    out = []
    for gpu, nodes in hosts.items():
        per = planner.gpus[gpu].node_gpus
        free = [h for h in nodes if (gpu, h) not in used]
        for k in sorted({*(k for k in HOST_COUNTS if k <= len(free)), len(free)} - {0}):
            if k * per < min_island.get(gpu, 1):
                continue
            take = tuple(free[:k])
            added = Piece(gpu, k * per, Hosts(per, take, 0), None, None)
            out.append((_ordered([*pieces, added]), f"add {k * per} x {gpu} on hosts {node_spans(take)}"))
    for i, p in enumerate(pieces):
        if p.origin is None or p.flipped:
            continue
        where = f"{p.size} x {p.gpu} (old island {p.origin})"
        if p.role is not None and Role(p.role).disaggregated:
            other = Role(p.role).other
            flipped = replace(p, role=other, flipped=True)
            out.append((_ordered([*pieces[:i], flipped, *pieces[i + 1 :]]), f"flip {where} to {other}"))
        out.append((pieces[:i] + pieces[i + 1 :], f"drop {where}"))
        per = planner.gpus[p.gpu].node_gpus
        if p.size % per:
            continue  # an island smaller than a host keeps its size
        pool = sorted({*p.hosts.nodes, *(h for h in hosts.get(p.gpu, ()) if (p.gpu, h) not in used)})
        for k in sorted({k for k in HOST_COUNTS if k <= len(pool)} | {len(pool)}):
            if k * per == p.size or k * per < min_island.get(p.gpu, 1):
                continue
            take = tuple(pool[:k])
            resized = Piece(p.gpu, k * per, Hosts(per, take, 0), None, None)
            out.append((_ordered([*pieces[:i], resized, *pieces[i + 1 :]]),
                        f"resize {where} to {k * per} x {p.gpu} on hosts {node_spans(take)}"))  # fmt: skip
    return out


def as_running(plan: Plan, old: Plan, found: Replanned) -> tuple[tuple[Island, ...], tuple[int, ...], tuple[str, ...],
                                                                 int]:  # fmt: skip
    """`plan` (built on `found`'s islands) with every kept island as its engines run in `old` (its batch and
    micro-batching), and the re-plan's kept islands, moves and hosts re-launched: a kept island whose configuration
    for this plan's workload differs from the one running is re-launched, a move more."""
    running = {(isl.gpu, isl.hosts.nodes, isl.role): isl for isl in old.islands
               if isl.serving and isl.hosts is not None}  # fmt: skip
    islands, kept, moves = list(plan.islands), [], list(found.moves)
    relaunched = found.hosts_relaunched
    for i in found.kept:
        now = islands[i]
        was = running.get((now.gpu, now.hosts.nodes if now.hosts else (), now.role))
        if was is not None and (was.tp, was.dp, was.ep) == (now.tp, now.dp, now.ep):
            islands[i] = replace(now, batch=was.batch, overlap=was.overlap, chunk_tokens=was.chunk_tokens)
            kept.append(i)
            continue
        before = f"TP {was.tp} x DP {was.dp}" if was is not None else "another configuration"
        moves.append(f"re-launch {now.size} x {now.gpu} {now.role} as TP {now.tp} x DP {now.dp} (ran {before}: its "
                     "configuration for this workload)")  # fmt: skip
        relaunched += len(now.hosts.nodes) if now.hosts else 0
    return tuple(islands), tuple(kept), tuple(moves), relaunched
