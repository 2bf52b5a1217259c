"""Every deploy setting is what it says, and none can change a launch file's structure.

Each string setting of conf/deploy.yaml (the deployment's own, every engine's and every target's section, taken from
the registries) is given hostile values: line breaks (`\\n`, `\\r\\n`, U+2028, U+0085), `: `, `{{ }}`, `$(...)`,
quotes, `#`, YAML's indicators and a 10,000-character string. Each is either refused in one line that names the
setting, its value and what it must be, or written into files that parse (every manifest and values file with
`yaml.safe_load_all`, routing.json, every host script's lines split into words as a shell splits them, and the lines of
llm-d's chart templates the values feed, rendered) to exactly what the same setting's plain value writes, the hostile
value standing where the plain one stands, as a string.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import REPO, compose, plan_of

DATA = REPO / "tests" / "data"
TABLE_PLAN = DATA / "plans" / "table_5_1_hetero_a_azure_code.json"  # multi-host engines, EPLB
HELPERS = DATA / "llmd" / "_helpers.tpl"

HOSTILE = [
    "img:v1\n  hostPID: true",
    "img:v1\r\n  hostPID: true",
    "img:v1\u2028  hostPID: true",
    "img:v1\x85  hostPID: true",
    "x: y",
    "{{ .Values.secret }}",
    '{{ lookup "v1" "Secret" "" "" }}',
    "$(touch /tmp/owned) `id` ${HOME}",
    "'single' \"double\" \\",
    "x # comment",
    "- item",
    "&anchor *alias !!python/object:os.system",
    "a" * 10_000,
]
# each bare, else as the tail of a path (settings that take one), else as a path of the kind a setting may ask for
VARIANTS = [(h, f"/m/{h}", f"/m/{h}.json") for h in HOSTILE]


def _records() -> list[tuple[str | None, type]]:
    """(conf/deploy.yaml section, record) of every setting: the deployment's own, then every engine's and target's."""
    from deployment.engines import ENGINES
    from deployment.options import DeployOptions
    from deployment.targets import TARGETS

    return [(None, DeployOptions), *((n, a.Options) for n, a in ENGINES.items()),
            *((n, t.Options) for n, t in TARGETS.items())]  # fmt: skip


def _own(section: str | None, record: type) -> list[dataclasses.Field[Any]]:
    """The fields `section` sets: a target's own, not those it shares with another section (llmd: the cluster's)."""
    from deployment.targets import TARGETS

    others = [s for s in TARGETS[section].sections if s != section] if section in TARGETS else []
    shared = {f.name for s in others for f in dataclasses.fields(TARGETS[s].Options)}
    subrecords = {"engine_options", "target_options"}  # DeployOptions': the sections' own records
    return [f for f in dataclasses.fields(record) if f.name not in shared | subrecords]


def _settings() -> list[tuple[str | None, dataclasses.Field[Any], Any]]:
    return [(s, f, typing.get_type_hints(r)[f.name]) for s, r in _records() for f in _own(s, r)]


def _strings() -> list[tuple[str | None, str]]:
    return [(s, f.name) for s, f, tp in _settings() if str in (typing.get_args(tp) or (tp,))]


def _name(section: str | None, name: str) -> str:
    return f"{section}.{name}" if section else name


def test_every_setting_says_what_it_must_be() -> None:
    """A boolean is a boolean, a count has bounds, a string names its grammar; each default and example follows it."""
    from deployment.options import Count, Grammar

    seen = set()
    for section, f, tp in _settings():
        kinds = typing.get_args(tp) or (tp,)
        rule, default = f.metadata.get("rule"), f.default
        seen.add(_name(section, f.name))
        if bool in kinds:
            assert rule is None and type(default) is bool
        elif int in kinds:
            assert isinstance(rule, Count) and rule.low <= default <= rule.high, f.name
        else:
            assert str in kinds and isinstance(rule, Grammar), f"{f.name}: a string setting names its grammar"
            assert rule.holds(rule.example) and (default is None or rule.holds(default)), f.name
    assert {"model_path", "ib_devices", "sglang.expert_location", "vllm.transfer_backend", "k8s.image",
            "k8s.router_replicas", "k8s.host_network", "llmd.sidecar_image"} <= seen  # fmt: skip


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("k8s.router_replicas", 100_000_000_000, "k8s: router_replicas=100000000000: must be a whole number from 1 to "
                                             "1000"),
    ("k8s.router_replicas", True, "k8s.router_replicas must be a whole number, got True"),
    ("k8s.host_network", "yes", "k8s.host_network must be true or false, got 'yes'"),
    ("k8s.image", "img:v1\n  hostPID: true", "k8s: image='img:v1\\n  hostPID: true': must be an OCI image reference"),
    ("k8s.image", "lmsysorg/SGLang:v1", "k8s: image='lmsysorg/SGLang:v1': must be an OCI image reference"),
    ("k8s.image", "img:" + "t" * 129, "k8s: image='img:ttttt"),
    ("k8s.router_image", "img:v1 #", "k8s: router_image='img:v1 #': must be an OCI image reference"),
    ("llmd.sidecar_image", "{{ .Values }}", "llmd: sidecar_image='{{ .Values }}': must be an OCI image reference"),
    ("k8s.gpu_label", "gpu: x", "k8s: gpu_label='gpu: x': must be a Kubernetes label key"),
    ("k8s.weights_pvc", "Weights", "k8s: weights_pvc='Weights': must be a Kubernetes object name (a DNS-1123 "
                                   "subdomain"),
    ("k8s.rdma_resource", "rdma", "k8s: rdma_resource='rdma': must be a Kubernetes extended resource name"),
    ("k8s.rdma_resource", "kubernetes.io/rdma", "k8s: rdma_resource='kubernetes.io/rdma': must be a Kubernetes "
                                               "extended resource name"),
    ("sglang.transfer_backend", "tcp", "sglang: transfer_backend='tcp': must be one of ['mooncake', 'nixl']"),
    ("sglang.expert_location", "eplb.json", "sglang: expert_location='eplb.json': must be an absolute path on every "
                                            "host to a recorded expert distribution (SGLang's .pt or .json)"),
    ("sglang.expert_location", "/m/eplb\u2028.json", "sglang: expert_location='/m/eplb\\u2028.json': must be"),
    ("vllm.transfer_backend", "mooncake", "vllm: transfer_backend='mooncake': must be one of ['nixl']"),
    ("model_path", "/m\n/x", "model_path='/m\\n/x': must be the weights' absolute path on every host"),
    ("ib_devices", "mlx5_0\n", "ib_devices='mlx5_0\\n': must be RDMA device names separated by commas"),
])  # fmt: skip
def test_a_setting_that_is_not_what_it_says_is_one_line_naming_it(setting: str, value: Any, says: str) -> None:
    """What a user sees for each kind of setting: the setting, its value (line breaks shown escaped) and what it must
    be, in one line; a string too long to show is cut short there."""
    from costmodel.codec import RecordError
    from deployment.errors import DeployError
    from pipeline.deploy import options_from_cfg

    data = _config(setting, value)
    with pytest.raises((DeployError, RecordError)) as err:
        options_from_cfg(data)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and says in text, text
    assert len(text) < 500, text  # a long value is shown cut short


@cache
def _defaults() -> str:
    from pipeline import cli
    from pipeline.deploy import COMMAND

    cfg = compose(["plan=x"], "deploy")
    return json.dumps({k: cli.plain(cfg[k]) for k in cfg if k not in COMMAND})


def _config(setting: str, value: Any, engine: str = "sglang", target: str = "shell") -> dict[str, Any]:
    """conf/deploy.yaml as composed, with `setting` (section.key or key) given `value`."""
    data = {**json.loads(_defaults()), "engine": engine, "target": target}
    section, _, key = setting.rpartition(".")
    (data[section] if section else data)[key] = value
    return data


# --- hostile values: refused in one line, or written as data --------------------------------------------------------


@cache
def _plan(kind: str) -> Any:
    import tempfile

    import plan as plans

    return plans.load(TABLE_PLAN if kind == "table" else plan_of(Path(tempfile.mkdtemp()))[0])


def _uses(section: str | None) -> list[tuple[str, str]]:
    """(engine, target) where a setting of `section` is read."""
    from deployment.engines import ENGINES
    from deployment.targets import TARGETS

    return [(e, t) for e in sorted(ENGINES) for t in sorted(TARGETS)
            if section in (None, e) or section in TARGETS[t].sections]  # fmt: skip


def _launch(setting: str, value: Any, engine: str, target: str, plan: Any) -> dict[str, str] | str:
    """The launch files for `setting`=`value` ({path: text}), or the one line that refuses it."""
    from costmodel.codec import RecordError
    from deployment.errors import DeployError
    from deployment.folder import files
    from pipeline.deploy import options_from_cfg

    try:
        return files(plan, options_from_cfg(_config(setting, value, engine, target)), "plan.json")[1]
    except (DeployError, RecordError) as err:
        return str(err)


@pytest.mark.parametrize(("section", "name"), _strings(), ids=lambda x: str(x))
def test_no_setting_value_changes_a_launch_file_s_structure(section: str | None, name: str) -> None:
    """Every hostile value of the setting, with every engine and target that reads it: refused in one line, or
    written where its plain value is written, as a string value, and nothing else changed."""
    from deployment.options import shown

    setting = _name(section, name)
    for engine, target in _uses(section):
        plain, kind = _plain(setting, engine, target)
        expected = _swapped(_parsed(_launch(setting, plain, engine, target, _plan(kind))), plain, plain)
        written = 0
        for variants in VARIANTS:
            for value in variants:
                out = _launch(setting, value, engine, target, _plan(kind))
                if isinstance(out, str):  # refused: one line naming the setting and its value
                    assert len(out.splitlines()) == 1 and f"{name}={shown(value)}" in out, (setting, value, out)
                    continue
                written += 1
                assert _swapped(_parsed(out), value, plain) == expected, (setting, value, engine, target)
                break
        if setting == "model_path":  # a path holds any character but a line break or NUL: the others are written
            assert written == len([h for h in HOSTILE if "\n" not in h]), (engine, target, written)


@cache
def _plain(setting: str, engine: str, target: str) -> tuple[str, str]:
    """The setting's plain value (its default, or its grammar's example), and a plan whose files it reaches."""
    section, _, key = setting.rpartition(".")
    record = dict(_records())[section or None]
    f = next(f for f in dataclasses.fields(record) if f.name == key)
    plain = f.default if isinstance(f.default, str) else f.metadata["rule"].example
    for kind in ("tiny", "table"):
        out = _launch(setting, plain, engine, target, _plan(kind))
        assert not isinstance(out, str), out
        if any(plain in text for p, text in out.items() if p != "README.md"):
            return plain, kind
    return plain, "tiny"  # a setting this engine and target do not read (e.g. SGLang's with vLLM)


def _parsed(out: dict[str, str] | str) -> dict[str, Any]:
    """Every launch file as what reads it: YAML documents, JSON, a script's lines as a shell splits them into words;
    llm-d's values also as the chart's template lines render them."""
    assert not isinstance(out, str), out
    parsed: dict[str, Any] = {}
    for path, text in out.items():
        if path.endswith((".yaml", ".yml")):
            docs = list(yaml.safe_load_all(text))
            parsed[path] = docs
            if path.startswith("llmd/"):
                parsed[path + " rendered"] = [rendered(v) for v in docs]
        elif path.endswith(".json"):
            parsed[path] = json.loads(text)
        elif path.endswith(".sh"):
            parsed[path] = [shlex.split(line) for line in text.split("\n")]
    return parsed


def _swapped(x: Any, hostile: str, plain: str) -> Any:
    """`x` with `hostile` replaced by `plain` in every string (as written, and as Kubernetes' `$$` escapes it), which
    must not be a key; a ConfigMap's routing.json is read first."""
    from deployment.launch import k8s_escape

    if isinstance(x, dict):
        assert hostile == plain or not any(hostile in str(k) for k in x), (hostile, list(x))  # only ever a value
        return {_swapped(k, hostile, plain): _swapped(json.loads(v) if k == "routing.json" and isinstance(v, str)
                                                      else v, hostile, plain) for k, v in x.items()}  # fmt: skip
    if isinstance(x, list):
        return [_swapped(v, hostile, plain) for v in x]
    if isinstance(x, str):
        return x.replace(k8s_escape(hostile), k8s_escape(plain)).replace(hostile, plain)
    return x


# --- llm-d's chart: the template lines the values feed, rendered -----------------------------------------------------

ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


class _Unrendered(Exception):
    """A template expression this renderer does not evaluate: the line is left out."""


def _lookup(scope: dict[str, Any], path: str) -> Any:
    value: Any = scope
    for key in path.strip(".").split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _condition(action: str, scope: dict[str, Any]) -> bool:
    """Whether an `if`/`with` action's body renders: the forms the container and routing-proxy templates use on the
    values Archipelago writes; any other (tracing, DRA, ...) reads values it does not write, so its body is left out."""
    if m := re.fullmatch(r"(?:if|with) (\.[\w.]+)", action):
        return bool(_lookup(scope, m[1]))
    if m := re.fullmatch(r'if hasKey \.(\w+) "(\w+)"', action):
        return m[2] in (scope.get(m[1]) or {})
    if action == 'if or (not (hasKey .proxy "enabled")) (ne .proxy.enabled false)':
        return scope["proxy"].get("enabled") is not False
    return False


def _print(value: Any) -> str:
    """A value as Go's text/template prints it."""
    return "<no value>" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _substitute(line: str, scope: dict[str, Any], used: set[str]) -> str:
    def one(m: re.Match[str]) -> str:
        expr = re.fullmatch(r'(?:required "[^"]*" |default (\S+) )?(\.[\w.]+)(?: \| default (\S+))?', m[1])
        if expr is None:
            raise _Unrendered(m[1])
        value = _lookup(scope, expr[2])
        if value is not None:  # a value of the values file, written as it is
            used.add(expr[2])
        fallback = expr[1] or expr[3]
        return _print(value) if value or not fallback else fallback.strip('"')

    return ACTION.sub(one, line)


def render(define: str, scope: dict[str, Any]) -> tuple[str, set[str]]:
    """The text lines of `define "llm-d-modelservice.<define>"` in the chart's _helpers.tpl whose conditions hold for
    `scope`, with the values substituted where the template writes them as they are (`{{ .container.image }}`,
    `{{ default 8000 .servicePort }}`, `{{ required "..." .proxy.image }}`); lines of includes, `toYaml` and
    `tplvalues.render` (YAML the chart writes itself, or a template `_untemplated` keeps `{{` out of) are left out.
    Also the paths of the values it wrote so."""
    lines = HELPERS.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if f'define "llm-d-modelservice.{define}"' in line)
    out, used, stack = [], set[str](), []
    for line in lines[k + 1 :]:
        if not ACTION.sub("", line).strip():  # actions only: control flow, comments, includes
            for action in ACTION.findall(line):
                word = action.split(" ", 1)[0]
                if word in ("if", "with", "range"):
                    stack.append(_condition(action, scope))
                elif word == "else":
                    stack[-1] = False
                elif word == "end":
                    if not stack:
                        return "\n".join(out), used  # the define's own end
                    stack.pop()
            continue
        if all(stack):
            try:
                out.append(_substitute(line, scope, used))
            except _Unrendered:
                continue
    raise AssertionError(f"no end of define {define}")


def rendered(v: dict[str, Any]) -> dict[str, Any]:
    """What the chart's container and routing-sidecar templates write from values `v`, parsed as YAML."""
    role = "decode" if v["decode"].get("create") else "prefill"
    texts = [render("container", {"container": c})[0] for c in v[role]["containers"]]
    containers = [item for text in texts for item in yaml.safe_load(text)]  # each a YAML list of one container
    scope = {"proxy": v["routing"]["proxy"], "servicePort": v["routing"]["servicePort"]}
    return {"containers": containers, "proxy": yaml.safe_load(render("routingProxy", scope)[0])}


def _llmd_values(engine: str) -> tuple[Any, dict[str, Any]]:
    from deployment.deployable import engines
    from deployment.engines import adapter
    from deployment.options import DeployOptions
    from deployment.targets import target
    from deployment.targets.llmd import values

    plan = _plan("tiny")
    e = next(e for e in engines(plan) if e.role == "decode")
    opts = adapter(engine).own(target("llmd").own(DeployOptions(engine=engine, target="llmd")))
    return e, values(plan, e, opts)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_chart_writes_the_values_as_given_and_every_unquoted_one_is_checked(engine: str) -> None:
    """The rendered container and sidecar hold the values as written; every value the chart writes unquoted is one
    `deployment.targets.llmd.unquoted` checks (it reads back as itself before the values file is written)."""
    from deployment.targets.llmd import unquoted

    _, v = _llmd_values(engine)
    out = rendered(v)
    (c,) = v["decode"]["containers"]
    assert out["containers"] == [{"name": c["name"], "image": c["image"], "env": None, "ports": None}]
    assert out["proxy"][0]["image"] == v["routing"]["proxy"]["image"] and "--secure-proxy=false" in out["proxy"][0][
        "args"]  # fmt: skip
    checked = unquoted(v)
    used = render("container", {"container": c})[1] | render("routingProxy", {"proxy": v["routing"]["proxy"],
                                                                              "servicePort": 8000})[1]  # fmt: skip
    paths = {p.replace(".container.", "decode.containers[0].").replace(".proxy.", "routing.proxy.")
             .replace(".servicePort", "routing.servicePort") for p in used}  # fmt: skip
    assert len(paths) == 8 and paths <= set(checked), paths - set(checked)


def test_a_value_that_would_add_a_key_to_the_rendered_pod_is_refused_before_it_is_written() -> None:
    """The renderer sees what the chart would do with an image holding a line break (the container gains `hostPID`),
    and the values of such an image are refused in one line naming where it sits, even past the settings' check."""
    from deployment.errors import DeployError
    from deployment.targets.llmd import _untemplated

    e, v = _llmd_values("sglang")
    bad = json.loads(json.dumps(v))
    bad["decode"]["containers"][0]["image"] = "img:v1\n  hostPID: true"
    assert rendered(bad)["containers"][0]["hostPID"] is True  # what Helm would render
    with pytest.raises(DeployError) as err:
        _untemplated(e, bad)
    assert str(err.value).startswith(f"{e.name}: decode.containers[0].image='img:v1\\n  hostPID: true': llm-d's chart "
                                     "writes it into the pod's YAML unquoted")  # fmt: skip
    bad = json.loads(json.dumps(v))
    bad["routing"]["proxy"]["image"] = "sidecar:v1 #"
    with pytest.raises(DeployError, match=r"routing\.proxy\.image='sidecar:v1 #'"):
        _untemplated(e, bad)
