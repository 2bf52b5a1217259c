"""The launch folder of a plan: engine scripts or manifests, routing.json, and a README that says what to
fill in and how to start (`write`). A folder is written whole, or replaces an earlier deploy whole: never a mix of
two deploys' files."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
from pathlib import Path

from deployment.deployable import engines
from deployment.engines import adapter
from deployment.errors import DeployError
from deployment.options import DeployOptions
from deployment.routing import routing
from deployment.targets import target
from deployment.targets.base import Target
from plan import Engine, Plan


def files(plan: Plan, opts: DeployOptions, source: str, prefix: str = "") -> tuple[list[Engine], dict[str, str]]:
    """(the engines, {path in the folder: text}) of the launch files of `plan`; `source` names the plan; `prefix`
    starts every engine's name (a fleet's model, so two models' engines never share a name)."""
    where = target(opts.target)
    opts = adapter(opts.engine).own(where.own(opts))
    es = [dataclasses.replace(e, name=prefix + e.name) for e in engines(plan)]
    where.refuse(plan, es, opts)
    route = routing(plan, es, where.protocol(opts), where.address, opts.model_path, where.health)
    out = where.files(plan, where.launched(plan, es), opts, route)
    out["routing.json"] = json.dumps(route, indent=1) + "\n"
    out["README.md"] = readme(plan, es, opts, source, sorted(out), where)
    return es, out


# the first line of every README.md `readme` writes: what marks a folder as an earlier deploy, which `write` may replace
MARK = "# Deployment of a plan: "


def earlier_deploy(folder: Path) -> bool:
    """Whether `folder` holds an earlier deploy: a README.md of ours (its first line starts with MARK)."""
    try:
        with (folder / "README.md").open(encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(MARK)
    except OSError:
        return False


def _refuse_used(out: Path, folder: Path, replace: bool) -> None:
    """DeployError where `folder` (the absolute `out`) may not become the launch folder: a file or link in its place,
    files that are not an earlier deploy, or an earlier deploy without `replace`."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DeployError(f"out={out}: is not a folder (a file or a link is there): choose a new or empty folder")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    if not earlier_deploy(folder):
        raise DeployError(f"out={out}: holds files that are not an earlier deploy (no README.md of pipeline.deploy's, "
                          f"whose first line starts {MARK.strip()!r}); replace=true replaces only an earlier deploy: "
                          "choose a new or empty folder")  # fmt: skip
    if not replace:
        raise DeployError(f"out={out}: holds an earlier deploy; give replace=true to replace it whole (what was "
                          "edited there is lost), or choose another out=")  # fmt: skip


def _fill(folder: Path, texts: dict[str, str]) -> None:
    for rel, text in texts.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)


def _swap(new: Path, folder: Path) -> None:
    """`new` in the place of `folder`: an earlier deploy there is renamed aside and removed only after `new` is in
    place, so a crash leaves the old folder or the new one (the old one then at `.<name>.old-*` beside it)."""
    if folder.is_dir() and any(folder.iterdir()):
        old = folder.with_name(f".{folder.name}.old-{secrets.token_hex(4)}")
        folder.rename(old)
        try:
            new.rename(folder)
        except OSError:
            old.rename(folder)  # the earlier deploy back in its place
            raise
        shutil.rmtree(old, ignore_errors=True)  # the new folder is in place: what cannot be removed stays hidden
    else:
        if folder.is_dir():
            folder.rmdir()
        new.rename(folder)


def write(plan: Plan, opts: DeployOptions, out: Path, source: str, *, replace: bool = False,
          prefix: str = "") -> list[Engine]:  # fmt: skip
    """Write the launch files of `plan` into the folder `out`, whole: into a new sibling folder, then swapped into
    place. `out` may be missing or empty, or an earlier deploy when `replace`; anything else is refused. The engines
    (`prefix`: `files`')."""
    es, texts = files(plan, opts, source, prefix)
    folder = Path(os.path.abspath(out))
    _refuse_used(out, folder, replace)
    new = folder.with_name(f".{folder.name}.new-{secrets.token_hex(4)}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        new.mkdir()
        _fill(new, texts)
        _swap(new, folder)
    except OSError as err:
        shutil.rmtree(new, ignore_errors=True)
        raise DeployError(f"out={out}: cannot write the launch files there ({err.strerror or err}): choose a "
                          "folder you can write") from None  # fmt: skip
    return es


def readme(plan: Plan, es: list[Engine], opts: DeployOptions, source: str, listed: list[str], where: Target) -> str:
    hosts: dict[str, set[int]] = {}
    for e in es:
        hosts.setdefault(e.gpu, set()).update(e.hosts)
    engine = adapter(opts.engine)
    v = plan.verification  # where the simulator sustains less than the stated rate, say so
    sim = f", {v.sustained_req_s:.1f} in the simulator" if v is not None and not v.sustained and v.sustained_req_s \
        else ""  # fmt: skip
    lines = [
        f"{MARK}{plan.rate_req_s:.1f} req/s within the SLOs{sim} ({opts.engine}, {opts.target})",
        "",
        f"Made by `python -m pipeline.deploy` from {source}. Hosts are numbered per GPU type, as the plan's "
        "report.md node map numbers them: " + "; ".join(f"{g}: {len(h)} hosts" for g, h in sorted(hosts.items())) + ".",
        "",
        f"The commands are written for {engine.title} and checked by its own settings resolution, which the tests "
        "read back against the plan (docs/deploy.md, section 3); another release may rename a flag or resolve a "
        f"setting otherwise: `python -m deployment.{opts.engine}_check PLAN` shows {engine.title}'s resolution.",
        "",
        "## Fill in",
        "",
        f"- the model weights' path on every host (now `{opts.model_path}`: `model_path=` when deploying);",
    ]
    if plan.replan is not None:
        relaunched = {e.island for e in where.launched(plan, es)}
        kept = sorted({e.island for e in es} - relaunched)
        keep = "" if not kept else (
            f" Islands {', '.join(str(i) for i in kept)} run on as they are: no launch files for them here; stop "
            "only the engines of the islands this folder launches anew before starting them.")  # fmt: skip
        lines[2:2] = [f"A re-plan of {plan.replan.from_plan}: {'; '.join(plan.replan.moves) or 'no move'} "
                      f"({plan.replan.hosts_relaunched} hosts re-launched).{keep}", ""]  # fmt: skip
    lines += where.readme(opts)
    lines += [
        "",
        "## What enforces the routing",
        "",
        "`deployment.router`: for each request it counts the prompt's tokens (token ids as given; text with the "
        f"model's tokenizer, `{opts.model_path}/tokenizer.json` as routing.json names it, or `--tokenizer`; without "
        "one it estimates characters / `chars_per_token` and says so when it starts), finds its range, draws a "
        "prefill island and a decode island with the plan's fractions for that range, then an engine of each that "
        "is up, and "
        + where.routes(opts)
        + (
            " Aggregated islands (they prefill and decode their own requests) are drawn first, against the prefill "
            "islands, with their fractions; an aggregated engine gets the request as sent and its answer is the "
            "client's."
            if any(e.role == "aggregated" for e in es)
            else ""
        ),
        "An engine that refuses connections or fails its health check (`GET /health`, every 2 s) is ejected and its "
        "requests go to the others of its island (503 when a range has none); one silent past `--timeout` is a 504 "
        "naming it. It admits up to twice the plan's requests in flight (`in_flight` in routing.json), serves "
        "Prometheus metrics on `/metrics`, listens on loopback unless given `--host`, asks for a Bearer key when "
        "given `--api-key` (or `ARCHIPELAGO_ROUTER_API_KEY`), and drains on SIGTERM (docs/deploy.md).",
        "",
        "## Engines",
        "",
        "| engine | role | GPUs | hosts | attention TP x DP | redundant experts | max running |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for e in es:
        lines.append(f"| {e.name} | {e.role} | {e.gpus} | {e.where} | {e.attn_tp} x {e.attn_dp} | "
                     f"{e.redundant_experts} | {e.max_running or '-'} |")  # fmt: skip
    lines += ["", "Files: " + ", ".join(f"`{f}`" for f in listed), ""]
    return "\n".join(lines)
