"""What a launch folder actually runs: each host script, and each container's command, executed for real (bash,
/bin/sh, Kubernetes' `$$` unescaping) with the engine programs (`python3`, `vllm`) replaced by a stand-in that
prints the arguments and environment it was given. A value a shell would read as code shows up here as a
changed argument or as something run (targets shell, k8s and llmd)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LEADER, HOST = "10.0.0.1", "10.0.0.2"  # the addresses the hosts are given
PROGRAM = f"""#!{sys.executable}
import json, os, sys
print(json.dumps({{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]], "env": dict(os.environ)}}))
"""


@dataclass
class Ran:
    where: str  # the script or the manifest's document and container
    argv: list[str]
    env: dict[str, str]
    engine: str = ""  # the engine it launches a host of (plan.Engine.name) ...
    template: bool = False  # ... as a worker pod template, which reads its host's index when it starts


def programs(tmp: Path) -> Path:
    """A folder of stand-in engine programs for PATH."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    for name in ("python3", "vllm"):
        path = bin_ / name
        path.write_text(PROGRAM)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_


def _run(cmd: list[str], env: dict[str, str], where: str, cwd: Path, engine: str, template: bool = False) -> Ran:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert r.returncode == 0, (where, r.stderr)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return Ran(where, out["argv"], out["env"], engine, template)


def scripts(folder: Path, tmp: Path) -> list[Ran]:
    """Every host script of a target=shell folder, run by bash with the addresses it asks for."""
    path = f"{programs(tmp)}:/usr/bin:/bin"
    env = {"PATH": path, "LEADER_ADDR": LEADER, "HOST_ADDR": HOST}
    return [_run(["bash", str(s)], env, str(s.relative_to(folder)), tmp, s.stem)
            for s in sorted(folder.glob("hosts/*/*.sh"))]


def unescape(text: str) -> str:
    """A command, argument or env value as the kubelet passes it: `$$` is `$`; a `$(VAR)` would be expanded."""
    assert "$(" not in text.replace("$$", ""), f"a Kubernetes $(VAR) reference: {text!r}"
    return text.replace("$$", "$")


def _env(container: dict[str, Any], index: int) -> dict[str, str]:
    out = {"LWS_LEADER_ADDRESS": LEADER, "LWS_WORKER_INDEX": str(index)}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = unescape(e["value"])
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            out[e["name"]] = HOST
        else:
            assert "secretKeyRef" in e.get("valueFrom", {}), e
    return out


def containers(folder: Path, tmp: Path) -> list[Ran]:
    """Every engine container of a target=k8s folder's manifests, its command run as the kubelet runs it (argv
    list, Kubernetes' escapes undone, LeaderWorkerSet's variables set; workers are index 1)."""
    path = f"{programs(tmp)}:/usr/bin:/bin"
    out = []
    for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()):
        spec, name = d.get("spec", {}), d["metadata"]["name"]
        lwt = spec.get("leaderWorkerTemplate", {})
        templates = [("leader", lwt.get("leaderTemplate"), 0), ("worker", lwt.get("workerTemplate"), 1),
                     ("pod", spec.get("template"), 0)]  # fmt: skip
        for kind, t, index in templates:
            if t is None or name == "archipelago-router":
                continue
            for c in t["spec"]["containers"]:
                cmd = [unescape(a) for a in c["command"]]
                out.append(_run(cmd, {"PATH": path, **_env(c, index)}, f"{name} {kind}", tmp, name, kind == "worker"))
    return out


def releases(folder: Path, tmp: Path, indices: tuple[int, ...] = (1,)) -> list[Ran]:
    """Every engine container of a target=llmd folder's values files, run as the kubelet runs it (`command` and
    `args`, Kubernetes' escapes undone); a multi-host engine's one pod template as the leader (index 0) and as the
    workers of `indices`."""
    path = f"{programs(tmp)}:/usr/bin:/bin"
    out = []
    for f in sorted(folder.glob("llmd/*.values.yaml")):
        v = yaml.safe_load(f.read_text())
        name = f.name.removesuffix(".values.yaml")
        (role,) = [r for r in ("prefill", "decode") if v[r].get("create")]
        runs = [("leader", 0), *(("worker", i) for i in indices)] if v["multinode"] else [("pod", 0)]
        for c in v[role]["containers"]:
            cmd = [unescape(a) for a in (*c["command"], *c.get("args", []))]
            for kind, index in runs:
                where = f"{name} {kind}" + (f" {index}" if kind == "worker" and indices != (1,) else "")
                out.append(_run(cmd, {"PATH": path, **_env(c, index)}, where, tmp, name, kind == "worker"))
    return out


def ran(folder: Path, target: str, tmp: Path) -> list[Ran]:
    return {"shell": scripts, "k8s": containers, "llmd": releases}[target](folder, tmp)


def engine_env(r: Ran) -> dict[str, str]:
    """The environment a run gave the engine, less what the test's own process had."""
    return {k: v for k, v in r.env.items() if k not in os.environ or os.environ[k] != v}
