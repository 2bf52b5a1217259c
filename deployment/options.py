"""What the launch files are written for (conf/deploy.yaml): the engine and the target by name, the weights' path,
the RDMA devices, and the engine's and the target's own options, each a record of its adapter or target module
(`deployment.engines.sglang.Sglang`, `deployment.targets.k8s.K8s`, ...). `pipeline.deploy` reads the config into
them strictly; a record checks its own values as it is made (`check_settings`).

Every setting says what it is: a boolean is only a boolean, a count a whole number within its bounds (`Count`), and a
string setting names its grammar (`setting(default, rule)`: an OCI image reference, a Kubernetes name, an absolute
path, one of a few choices, ...), so no value can carry a line break, a `: ` or a `{{` into a manifest, a values file
or a chart's template. A string setting without a grammar is a programming error the targets' contract finds.
"""

from __future__ import annotations

import dataclasses
import re
import typing
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from deployment.errors import DeployError


@dataclass(frozen=True)
class Grammar:
    """What a string setting must be: `must` says it in a message, `holds` tests a value, `example` is one that is."""

    must: str
    holds: Callable[[str], bool]
    example: str


@dataclass(frozen=True)
class Count:
    """A whole-number setting within [low, high]."""

    low: int
    high: int

    @property
    def must(self) -> str:
        return f"a whole number from {self.low} to {self.high}"


def setting(default: Any, rule: Grammar | Count) -> Any:
    """A field of an options record whose value must follow `rule`, checked as the record is made."""
    return field(default=default, metadata={"rule": rule})


def shown(value: Any) -> str:
    """`value` as a message shows it: its repr (line breaks escaped), cut short when long."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...' ({len(value)} characters)"


# --- the grammars ---------------------------------------------------------------------------------------------------


def _no_control(text: str) -> bool:
    """No control character, line or paragraph separator (U+0085, U+2028, U+2029 included)."""
    return not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def one_of(*choices: str) -> Grammar:
    return Grammar(f"one of {list(choices)}", lambda text: text in choices, choices[-1])


# the distribution reference grammar (distribution/reference/regexp.go, what `docker pull` and kubelet parse):
# [host[:port]/]path-component(/path-component)*[:tag][@algorithm:hex]
_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_HOST_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[A-Fa-f0-9:]+\])(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*)(?::[\w][\w.-]{{0,127}})?"
    r"(?:@(?:sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}))?",
    re.ASCII,
)


def _image(text: str) -> bool:
    m = _REFERENCE.fullmatch(text)
    return m is not None and len(m["name"]) <= 255


# Kubernetes' names (k8s.io/apimachinery/pkg/util/validation): a DNS-1123 label and subdomain, a qualified name
# ([prefix/]name: a label key, a resource name)
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)


def _subdomain(text: str) -> bool:
    return len(text) <= 253 and re.fullmatch(rf"{_LABEL}(?:\.{_LABEL})*", text, re.ASCII) is not None


def _qualified(text: str, *, prefixed: bool = False) -> bool:
    prefix, slash, name = text.rpartition("/")
    if (slash and not _subdomain(prefix)) or (prefixed and not slash):
        return False
    return _NAME.fullmatch(name) is not None


def _extended_resource(text: str) -> bool:
    domain = text.rpartition("/")[0]
    return _qualified(text, prefixed=True) and not domain.endswith("kubernetes.io")


IMAGE = Grammar("an OCI image reference, [registry[:port]/]name[:tag][@sha256:digest] (lower-case name components; "
                "no whitespace or control characters)", _image, "registry.example.com:5000/team/engine:v2")  # fmt: skip
LABEL_KEY = Grammar("a Kubernetes label key, [DNS subdomain/]name (63 characters at most: letters, digits, '-', '_', "
                    "'.', alphanumeric at both ends)", _qualified, "example.com/gpu")  # fmt: skip
OBJECT_NAME = Grammar("a Kubernetes object name (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', "
                      "alphanumeric at both ends, 253 characters at most)", _subdomain, "weights-dsv3")  # fmt: skip
RESOURCE = Grammar("a Kubernetes extended resource name, domain/name (a DNS subdomain outside kubernetes.io, then a "
                   "name of 63 characters at most)", _extended_resource, "example.com/rdma")  # fmt: skip
REGISTRY_NAME = Grammar("a name of its registry (lower-case letters, digits and '_', 63 characters at most)",
                        lambda text: re.fullmatch(r"[a-z][a-z0-9_]{0,62}", text) is not None, "other")  # fmt: skip
WEIGHTS_PATH = Grammar("the weights' absolute path on every host, with no line break or NUL",
                       lambda text: text.startswith("/") and "\n" not in text and "\0" not in text,
                       "/other/weights")  # fmt: skip
RDMA_DEVICES = Grammar("RDMA device names separated by commas, e.g. mlx5_0,mlx5_1 (`ibv_devices` lists a host's)",
                       lambda text: re.fullmatch(r" *[\w.:-]+( *, *[\w.:-]+)* *", text, re.ASCII) is not None,
                       "mlx5_2")  # fmt: skip
EXPERT_LOCATION = Grammar("an absolute path on every host to a recorded expert distribution (SGLang's .pt or .json), "
                          "with no control characters",
                          lambda text: text.startswith("/") and text.endswith((".pt", ".json")) and _no_control(text),
                          "/other/expert_distribution.json")  # fmt: skip


# --- the check every record runs ------------------------------------------------------------------------------------


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _must(f: dataclasses.Field[Any], kinds: tuple[Any, ...], value: Any, where: str) -> str | None:
    """What setting `f` (of annotation `kinds`) must be where `value` is not that; None where it is."""
    rule = f.metadata.get("rule")
    if bool in kinds:
        return None if type(value) is bool else "true or false"
    if int in kinds:
        assert isinstance(rule, Count), f"{where}.{f.name}: a count says its bounds (deployment.options.setting)"
        return None if type(value) is int and rule.low <= value <= rule.high else rule.must
    if str in kinds:
        if not isinstance(rule, Grammar):
            raise TypeError(f"{where}.{f.name}: a string setting says what it must be (deployment.options.setting)")
        return None if isinstance(value, str) and rule.holds(value) else rule.must
    return None  # a sub-record (the engine's or target's options): it checked itself


def check_settings(record: Any) -> None:
    """DeployError naming the first setting of `record` that is not what its field says, its value, and what it must
    be (one line: the value is shown as its repr)."""
    hints = _hints(type(record))
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
        if value is None and type(None) in kinds:
            continue
        must = _must(f, kinds, value, type(record).__name__)
        if must is not None:
            raise DeployError(f"{f.name}={shown(value)}: must be {must}")


@dataclass(frozen=True)
class EngineOptions:
    """The base of an engine's own options (`Adapter.Options`): none by default."""

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class TargetOptions:
    """The base of a target's own options (`Target.Options`): none by default."""

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class DeployOptions:
    """The engine and target to write launch files for, and what every engine host provides."""

    engine: str = setting("sglang", REGISTRY_NAME)  # a name of deployment.engines.ENGINES
    target: str = setting("shell", REGISTRY_NAME)  # a name of deployment.targets.TARGETS
    model_path: str = setting("/models/DeepSeek-V3", WEIGHTS_PATH)  # the weights' path on every host
    ib_devices: str | None = setting(None, RDMA_DEVICES)  # RDMA devices for KV transfer (None: the engine's pick)
    engine_options: EngineOptions | None = None  # the engine's own (None: its defaults)
    target_options: TargetOptions | None = None  # the target's own (None: its defaults)

    def __post_init__(self) -> None:
        check_settings(self)
