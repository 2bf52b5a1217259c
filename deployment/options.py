"""What the launch files are written for (conf/deploy.yaml): the engine and the target by name, the weights' path,
the RDMA devices, and the engine's and the target's own options, each a record of its adapter or target module
(`deployment.engines.sglang.Sglang`, `deployment.targets.k8s.K8s`, ...). `pipeline.deploy` reads the config into
them strictly; a record checks its own values as it is made."""

from __future__ import annotations

import re
from dataclasses import dataclass

from deployment.errors import DeployError


@dataclass(frozen=True)
class EngineOptions:
    """The base of an engine's own options (`Adapter.Options`): none by default."""


@dataclass(frozen=True)
class TargetOptions:
    """The base of a target's own options (`Target.Options`): none by default."""


@dataclass(frozen=True)
class DeployOptions:
    """The engine and target to write launch files for, and what every engine host provides."""

    engine: str = "sglang"  # a name of deployment.engines.ENGINES
    target: str = "shell"  # a name of deployment.targets.TARGETS
    model_path: str = "/models/DeepSeek-V3"  # the weights' path on every host
    ib_devices: str | None = None  # RDMA devices for KV transfer, e.g. "mlx5_0,mlx5_1" (None: the engine's pick)
    engine_options: EngineOptions | None = None  # the engine's own (None: its defaults)
    target_options: TargetOptions | None = None  # the target's own (None: its defaults)

    def __post_init__(self) -> None:
        if not self.model_path or not self.model_path.startswith("/"):
            raise DeployError(f"model_path={self.model_path!r}: give the weights' absolute path on every host")
        if "\n" in self.model_path or "\0" in self.model_path:
            raise DeployError("model_path holds a line break or NUL: give the weights' path on every host")
        if self.ib_devices is not None and not re.fullmatch(r"\s*[\w.:-]+(\s*,\s*[\w.:-]+)*\s*", self.ib_devices):
            raise DeployError(f"ib_devices={self.ib_devices!r}: RDMA device names separated by commas, e.g. "
                              "mlx5_0,mlx5_1 (`ibv_devices` lists a host's)")  # fmt: skip
