"""An engine's launch on one host, and how each target writes it without a shell ever reading a value.

A `Launch` is the program's arguments as literal strings, the environment it needs, and the few
values only the host knows when it starts (`Ref`: the engine leader's address, this host's own
address, its index in a LeaderWorkerSet). Literal values are never interpreted: the host script
quotes every one (`shell_line`), the manifests pass them as an argv list with Kubernetes' own
`$(VAR)` expansion escaped (`k8s_command`), and a host-known value is written as an explicit
reference of the target (`"${LEADER_ADDR}"`, `"${LWS_LEADER_ADDRESS}"`, `$((LWS_WORKER_INDEX * 8))`),
never smuggled through a value. `example_argv` fills the references with example values: the
command line exactly as the engine parses it, for the engines' own checks.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from plan import Engine

LEADER, HOST, INDEX = "leader", "host", "index"
EXAMPLE = {LEADER: "10.0.0.1", HOST: "10.0.0.2"}  # example_argv's addresses
WORKER = -1  # a Kubernetes worker pod's rank: LeaderWorkerSet's LWS_WORKER_INDEX, read at start

# the ports the launches listen on
ENGINE_PORT = 30000  # an engine's HTTP server (its leader's)
BOOTSTRAP_PORT = 8998  # SGLang's prefill bootstrap server (--disaggregation-bootstrap-port default)
DIST_PORT = 5000  # the leader's port for the engine's distributed init
ROUTER_PORT = 8000  # the plan's router (deployment.router)


@dataclass(frozen=True)
class Ref:
    """A value the host knows only when it starts: `what` is LEADER (the engine leader's address), HOST
    (this host's address) or INDEX (this pod's index in its LeaderWorkerSet, times `times`), then `suffix`."""

    what: str
    suffix: str = ""
    times: int = 1

    def __post_init__(self) -> None:
        assert self.what in (LEADER, HOST, INDEX), self.what


@dataclass(frozen=True)
class Launch:
    """A program's arguments (literal), its environment (literal or host-known) and its host-known flags."""

    argv: list[str]
    env: dict[str, str | Ref] = field(default_factory=dict)
    late: list[tuple[str, Ref]] = field(default_factory=list)  # (flag, value) appended after argv


def uses(launch: Launch) -> set[str]:
    """What host-known values the launch reads (LEADER, HOST, INDEX)."""
    return {r.what for r in (*launch.env.values(), *(ref for _, ref in launch.late)) if isinstance(r, Ref)}


def _double_quoted(text: str) -> str:
    """`text` inside double quotes: the characters a shell still reads there escaped."""
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


def shell_value(ref: Ref, index: int) -> str:
    """A host script's word for `ref` (host `index` of its engine, known when the script is written)."""
    if ref.what == INDEX:
        return shlex.quote(str(index * ref.times) + ref.suffix)
    var = {LEADER: "LEADER_ADDR", HOST: "HOST_ADDR"}[ref.what]
    return f'"${{{var}}}{_double_quoted(ref.suffix)}"'


def shell_line(launch: Launch, index: int) -> str:
    """`exec` of the launch for a host script, every literal quoted."""
    words = [shlex.quote(a) for a in launch.argv]
    for flag, ref in launch.late:
        words += [shlex.quote(flag), shell_value(ref, index)]
    return "exec " + " ".join(words)


def shell_env(launch: Launch, index: int) -> list[str]:
    """`export NAME=value` lines of the launch's environment."""
    out = []
    for name, value in launch.env.items():
        word = shell_value(value, index) if isinstance(value, Ref) else shlex.quote(value)
        out.append(f"export {name}={word}")
    return out


def k8s_escape(text: str) -> str:
    """`text` as Kubernetes passes it: `$$` is its escape for `$` in command, args and env values."""
    return text.replace("$", "$$")


def _k8s_word(ref: Ref) -> str:
    if ref.what == INDEX:
        word = f"$((LWS_WORKER_INDEX * {ref.times}))" if ref.times != 1 else "${LWS_WORKER_INDEX}"
        return f'"{word}{_double_quoted(ref.suffix)}"'
    var = {LEADER: "LWS_LEADER_ADDRESS", HOST: "POD_IP"}[ref.what]
    return f'"${{{var}}}{_double_quoted(ref.suffix)}"'


def k8s_command(launch: Launch) -> list[str]:
    """The container's command: the literal argv as a list; host-known flags through a fixed `/bin/sh -c`
    script that holds no value of the plan or the settings (those stay positional arguments, `"$@"`)."""
    argv = [k8s_escape(a) for a in launch.argv]
    if not launch.late:
        return argv
    script = 'exec "$@"' + _late_words(launch)
    return ["/bin/sh", "-c", k8s_escape(script), "engine", *argv]


# one pod template for a multi-host engine's leader and workers (llm-d model-service's LeaderWorkerSet has no
# leader template): positional arguments are the leader's argument count, the leader's arguments, then the
# workers'; the pod's LeaderWorkerSet index picks one list. The script holds no value of the plan or the settings.
_BRANCH = (
    'n=$1; shift; if [ "${LWS_WORKER_INDEX:-0}" = 0 ]; then c=$#; i=0; '
    'for a do if [ "$i" -lt "$n" ]; then set -- "$@" "$a"; fi; i=$((i+1)); done; shift "$c"; exec "$@"@LEADER@; '
    'fi; shift "$n"; exec "$@"@WORKER@'
)


def _late_words(launch: Launch) -> str:
    return "".join(f" {shlex.quote(flag)} {_k8s_word(ref)}" for flag, ref in launch.late)


def k8s_shared_command(leader: Launch, worker: Launch) -> list[str]:
    """One container command for both a LeaderWorkerSet's leader (index 0) and its workers: each runs its own
    launch's arguments, exactly as `k8s_command` would give them (the two must share their environment)."""
    assert leader.env == worker.env, "a shared pod template has one environment"
    script = _BRANCH.replace("@LEADER@", _late_words(leader)).replace("@WORKER@", _late_words(worker))
    args = [k8s_escape(a) for a in (*leader.argv, *worker.argv)]
    return ["/bin/sh", "-c", k8s_escape(script), "engine", str(len(leader.argv)), *args]


def example_argv(launch: Launch, index: int) -> list[str]:
    """The arguments as the engine on host `index` receives them, host-known values given example values."""
    out = list(launch.argv)
    for flag, ref in launch.late:
        value = str(index * ref.times) if ref.what == INDEX else EXAMPLE[ref.what]
        out += [flag, value + ref.suffix]
    return out


def example_env(launch: Launch, index: int) -> dict[str, str]:
    """The launch's environment with host-known values given example values."""
    return {
        k: (v if isinstance(v, str) else (str(index * v.times) if v.what == INDEX else EXAMPLE[v.what]) + v.suffix)
        for k, v in launch.env.items()
    }


def visible_devices(e: Engine) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` of an engine smaller than its host: its slice of its host's GPUs (none on whole hosts)."""
    cut = e.placement.gpu_slice if e.placement else None
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(cut[0], cut[1] + 1)))} if cut else {}
