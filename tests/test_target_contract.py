"""The suite every deploy target of `deployment.targets.TARGETS` passes, with every engine: it writes its launch
folder for a plan (its files, routing.json in the router's protocol, a README that says what to fill in and how to
start), its options round-trip from conf/deploy.yaml through `pipeline.deploy` into its own record, and an unknown
target or engine is refused in one line naming the choices. What each target's files run is the command the engines'
own checks judged: tests/test_launch_files.py, every target."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest

import plan as plans
from deployment.engines import ENGINES
from deployment.folder import files
from deployment.options import DeployOptions
from deployment.targets import TARGETS, target
from deployment.targets.base import Target
from helpers import REPO, compose, in_process, one_line, plan_of

TABLE_PLAN = REPO / "tests" / "data" / "plans" / "table_5_1_hetero_a_azure_code.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plan_of(tmp_path_factory.mktemp("plan"))[0]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_target_writes_its_launch_folder(tiny: Path, name: str, engine: str) -> None:
    t = TARGETS[name]
    for path in (tiny, TABLE_PLAN):
        plan = plans.load(path)
        es, out = files(plan, DeployOptions(engine=engine, target=name), str(path))
        assert {"routing.json", "README.md"} < set(out), sorted(out)  # and the target's own files
        route = json.loads(out["routing.json"])
        assert route["protocol"] == t.protocol(DeployOptions(engine=engine, target=name))
        urls = [u for phase in route["islands"].values() for isl in phase.values() for u in isl["engines"]]
        assert sorted(urls) == sorted(t.address(e) for e in es)
        readme = out["README.md"]
        assert readme.startswith(f"# Deployment of a plan: {plan.rate_req_s:.1f} req/s") and "## Start" in readme
        assert all(e.name in readme for e in es)


def _other(kind: Any, default: Any, field: dataclasses.Field[Any]) -> Any:
    """A value of annotation `kind` other than `default`, for `field`: a string or a count that its rule takes."""
    kinds = typing.get_args(kind) or (kind,)
    rule = field.metadata.get("rule")
    if bool in kinds:
        return not default
    if int in kinds:
        return rule.high if default != rule.high else rule.low
    assert rule.example != default, field.name
    return rule.example


def _overrides(t: Target) -> tuple[list[str], dict[str, Any]]:
    """Hydra overrides that set every field of `t`'s options to another value than its default, each in the first of
    its sections that has it (target=llmd: the cluster's in `k8s`, its own in `llmd`), and those values."""
    hints = typing.get_type_hints(t.Options)
    values = {f.name: _other(hints[f.name], getattr(t.Options(), f.name), f) for f in dataclasses.fields(t.Options)}
    section = {k: next(s for s in t.sections if k in {f.name for f in dataclasses.fields(TARGETS[s].Options)})
               for k in values}  # fmt: skip
    return [f"++{section[k]}.{k}={json.dumps(v) if isinstance(v, str) else str(v).lower()}"
            for k, v in values.items()], values  # fmt: skip


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_targets_options_round_trip_from_the_config(name: str) -> None:
    from pipeline.deploy import options_from_cfg

    t = TARGETS[name]
    overrides, values = _overrides(t)
    opts = options_from_cfg(compose(["plan=x", f"target={name}", *overrides], "deploy"))
    assert opts.target == name and opts.target_options == t.Options(**values)
    assert options_from_cfg(compose(["plan=x", f"target={name}"], "deploy")).target_options == t.Options()


@pytest.mark.parametrize("setting, says", [
    ("target=nomad", f"error: target='nomad': unknown target; choose from {sorted(TARGETS)}"),
    ("engine=tgi", f"error: engine='tgi': unknown engine; choose from {sorted(ENGINES)}"),
    ("k8s.host_network=no", "error: conf/deploy.yaml (or its overrides): k8s.host_network must be true or false, "
                            "got 'no'"),
    ("+namespace=prod", "error: conf/deploy.yaml (or its overrides): `namespace` is not a field of DeployConfig"),
    ("+k8s.namespace=prod", "error: conf/deploy.yaml (or its overrides): k8s: `namespace` is not a field of K8s"),
    ("sglang.transfer_backend=tcp", "error: conf/deploy.yaml (or its overrides): sglang: transfer_backend='tcp': "
                                    "must be one of ['mooncake', 'nixl']"),
    ("k8s.router_replicas=0", "error: conf/deploy.yaml (or its overrides): k8s: router_replicas=0: must be a whole "
                              "number from 1 to 1000"),
    ("k8s.router_replicas=100000000000", "error: conf/deploy.yaml (or its overrides): k8s: "
                                         "router_replicas=100000000000: must be a whole number from 1 to 1000"),
    ("k8s.image='img:v1\n hostPID: true'", "error: conf/deploy.yaml (or its overrides): k8s: image='img:v1\\n "
                                           "hostPID: true': must be an OCI image reference"),
    ("replace=yes", "error: conf/deploy.yaml (or its overrides): replace must be true or false, got 'yes'"),
])  # fmt: skip
def test_an_unknown_or_mistyped_setting_is_one_line(tiny: Path, tmp_path: Path, setting: str, says: str) -> None:
    from pipeline.deploy import execute

    one_line(in_process(execute, "deploy", f"plan={tiny}", f"out={tmp_path / 'd'}", setting), says)
    assert not (tmp_path / "d").exists()


def test_the_registry_refuses_an_unknown_target_with_the_choices() -> None:
    from deployment.errors import DeployError

    with pytest.raises(DeployError, match=re.escape(f"target='nomad': unknown target; choose from {sorted(TARGETS)}")):
        target("nomad")
