"""Where a plan's engines run, one module each (`base.Target`: its options, refusals, engine addresses, files and
README sections), and their registry. Adding one: a module beside shell.py, k8s.py and llmd.py, a line here, its
section in conf/deploy.yaml; `tests/test_target_contract.py` runs it through the suite every target passes."""

from __future__ import annotations

from deployment.errors import DeployError
from deployment.targets.base import Target
from deployment.targets.k8s import K8sTarget
from deployment.targets.llmd import LlmdTarget
from deployment.targets.shell import ShellTarget

TARGETS: dict[str, Target] = {t.name: t for t in (ShellTarget(), K8sTarget(), LlmdTarget())}


def target(name: str) -> Target:
    """The target named `name`; DeployError with the valid choices for another."""
    if name not in TARGETS:
        raise DeployError(f"target={name!r}: unknown target; choose from {sorted(TARGETS)}")
    return TARGETS[name]
