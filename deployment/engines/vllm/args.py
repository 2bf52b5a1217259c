"""Check `vllm serve` command lines against vLLM's own argument definitions, without importing vLLM.

vLLM builds `vllm serve`'s parser in `EngineArgs.add_cli_args` (vllm/engine/arg_utils.py): one
`group.add_argument("--flag", "-alias", **cls_kwargs["field"])` per flag, where
`cls_kwargs = get_kwargs(SomeConfig)` turns the config dataclass field's annotation into argparse
keywords (`_compute_kwargs`: a nested dataclass takes JSON validated by that dataclass, `bool` is
`--flag/--no-flag`, `Literal` gives choices, `int`/`float` a number, `list` several values), plus
`FrontendArgs` (every field a flag) and `make_arg_parser`'s own flags
(vllm/entrypoints/common/cli_args.py). Its wheel is several hundred MB of CUDA code and its sdist
builds only with PyTorch, so `vllm_source` unpacks the Python package of the published sdist of one
pinned version and `vllm_parser` rebuilds the parser from those files by the same rules. (The faster
check `benchmarks/deploy_bench.py` uses; `deployment.engines.vllm.check` runs vLLM's own resolution on
the same source.)
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
from pathlib import Path
from typing import Any

from deployment.engines.base import EngineArgsMissing, parse_strictly
from deployment.engines.vllm.launch import VERSION


def vllm_source(version: str = VERSION) -> Path:
    """vLLM `version`'s Python package (`vllm/`, every file) from its sdist on PyPI, sha256-checked, cached: the
    argument definitions `vllm_parser` reads, and the code `deployment.engines.vllm.check` runs.

    The cache is `$ARCHIPELAGO_CACHE` (default `~/.cache/archipelago`)/vllm-<version>-py."""
    import hashlib
    import re
    import shutil
    import tarfile
    import tempfile
    import urllib.request
    from urllib.parse import urljoin

    cache = Path(os.environ.get("ARCHIPELAGO_CACHE", Path.home() / ".cache" / "archipelago"))
    root = cache / f"vllm-{version}-py"
    if (root / "vllm" / "engine" / "arg_utils.py").is_file():
        return root
    index = "https://pypi.org/simple/vllm/"  # PEP 503 index: links carry their sha256
    cache.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(index, timeout=60) as r:
            page = r.read().decode()
        link = re.search(rf'href="([^"]*/vllm-{re.escape(version)}\.tar\.gz)#sha256=([0-9a-f]+)"', page)
        if link is None:
            raise ValueError(f"no sdist of vllm {version} listed")
        digest = hashlib.sha256()
        with tempfile.TemporaryFile(dir=cache) as blob:
            with urllib.request.urlopen(urljoin(index, link[1]), timeout=300) as r:
                while chunk := r.read(1 << 20):
                    digest.update(chunk)
                    blob.write(chunk)
            if digest.hexdigest() != link[2]:
                raise ValueError("the download does not match its sha256")
            blob.seek(0)
            tmp = Path(tempfile.mkdtemp(prefix=f".vllm-{version}-py.", dir=cache))
            with tarfile.open(fileobj=blob, mode="r:gz") as tar:
                for m in tar.getmembers():
                    rel = m.name.partition("/")[2]  # drop the "vllm-<version>/" prefix
                    if m.isfile() and rel.startswith("vllm/"):
                        dest = tmp / rel
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(tar.extractfile(m).read())  # type: ignore[union-attr]
    except (OSError, ValueError, tarfile.TarError) as err:
        raise EngineArgsMissing(
            f"could not fetch vLLM {version}'s source from {index} ({err}); "
            f"unpack its sdist's vllm/ into {root} by hand (so that {root}/vllm/engine/arg_utils.py exists)"
        ) from None
    try:
        tmp.rename(root)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class _Module:
    """Module-level type aliases and dataclass fields of the parsed vLLM files."""

    def __init__(self, paths: list[Path]) -> None:
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, tuple[list[str], dict[str, ast.AnnAssign]]] = {}
        for path in paths:
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.aliases.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    if getattr(node.annotation, "id", None) == "TypeAlias":
                        self.aliases.setdefault(node.target.id, node.value)
                elif isinstance(node, ast.ClassDef):
                    fields = {
                        s.target.id: s
                        for s in node.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    }
                    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                    self.classes.setdefault(node.name, (bases, fields))

    def fields(self, cls: str) -> dict[str, ast.AnnAssign]:
        bases, own = self.classes[cls]
        out: dict[str, ast.AnnAssign] = {}
        for b in bases:
            if b in self.classes:
                out.update(self.fields(b))
        return {**out, **own}

    def members(self, ann: ast.expr, depth: int = 0) -> list[ast.expr]:
        """The members of a union annotation (`A | B`, `Optional[A]`, `Union[A, B]`), aliases resolved."""
        if depth > 8:
            return [ann]
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a forward reference
            try:
                return self.members(ast.parse(ann.value, mode="eval").body, depth + 1)
            except SyntaxError:
                return [ann]
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return self.members(ann.left, depth + 1) + self.members(ann.right, depth + 1)
        if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) in ("Optional", "Union"):
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            return [m for e in elts for m in self.members(e, depth + 1)]
        if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "Annotated":
            return self.members(ann.slice.elts[0], depth + 1)  # type: ignore[attr-defined]
        if isinstance(ann, ast.Name) and ann.id in self.aliases and ann.id not in self.classes:
            return self.members(self.aliases[ann.id], depth + 1)
        return [ann]

    def literal(self, ann: ast.expr, depth: int = 0) -> list[object]:
        """The values of a `Literal[...]` (nested literals and aliases flattened)."""
        elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]  # type: ignore[attr-defined]
        out: list[object] = []
        for e in elts:
            if isinstance(e, ast.Constant):
                out.append(e.value)
            else:
                for m in self.members(e, depth + 1):
                    if isinstance(m, ast.Subscript) and getattr(m.value, "id", None) == "Literal":
                        out += self.literal(m, depth + 1)
        return out

    def kind(self, ann: ast.expr) -> tuple[str, Any]:
        """As vLLM's `_compute_kwargs` orders it: ("dataclass", name), ("optional-bool", None),
        ("bool", None), ("choices", values), ("list", None), ("int", None), ("float", None),
        ("json", None) or ("str", None)."""
        ms = self.members(ann)
        names = {getattr(m, "id", None) for m in ms}
        heads = {getattr(m.value, "id", None) for m in ms if isinstance(m, ast.Subscript)}
        for m in ms:
            if isinstance(m, ast.Name) and m.id in self.classes and self.fields(m.id):
                return "dataclass", m.id
        if names >= {"bool", "str"}:
            return "optional-bool", None
        if "bool" in names:
            return "bool", None
        lits = [m for m in ms if isinstance(m, ast.Subscript) and getattr(m.value, "id", None) == "Literal"]
        if lits:
            return "choices", [v for lit in lits for v in self.literal(lit)]
        if heads & {"list", "tuple", "set", "List", "Tuple", "Set"} or names & {"list", "tuple", "set"}:
            return "list", None
        if "int" in names:
            return "int", None
        if "float" in names:
            return "float", None
        if heads & {"dict", "Dict"} or names & {"dict"}:
            return "json", None
        return "str", None


def _bounds(stmt: ast.AnnAssign) -> dict[str, float]:
    """`ge`/`gt`/`le`/`lt` of a field declared `= Field(default=..., ge=1)`."""
    v = stmt.value
    if isinstance(v, ast.Call) and getattr(v.func, "id", None) == "Field":
        return {
            k.arg: k.value.value
            for k in v.keywords
            if k.arg in ("ge", "gt", "le", "lt") and isinstance(k.value, ast.Constant)
        }
    return {}


def _number(kind: type, bounds: dict[str, float], flag: str) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        for op, limit in bounds.items():
            ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[op]
            if not ok:
                raise argparse.ArgumentTypeError(f"{flag} {text}: must be {op} {limit}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _json_of(mod: _Module, cls: str, flag: str) -> Any:
    """A JSON object whose keys are fields of `cls`, with `Literal` and numeric fields checked."""
    import json

    def parse(text: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(f"{flag}: not JSON ({err})") from None
        fields = mod.fields(cls)
        if not isinstance(obj, dict):
            raise argparse.ArgumentTypeError(f"{flag}: wants a JSON object of {cls}")
        for key, value in obj.items():
            if key not in fields:
                raise argparse.ArgumentTypeError(f"{flag}: {cls} has no field {key!r}")
            kind, arg = mod.kind(fields[key].annotation)
            if kind == "choices" and value not in arg:
                raise argparse.ArgumentTypeError(f"{flag}: {cls}.{key}={value!r} is not one of {arg}")
            if kind in ("int", "float"):
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise argparse.ArgumentTypeError(f"{flag}: {cls}.{key} wants a number, not {value!r}")
                _number(float, _bounds(fields[key]), f"{flag} {key}")(str(value))
        return obj

    return parse


def _add(
    parser: argparse.ArgumentParser,
    mod: _Module,
    flags: list[str],
    field: ast.AnnAssign | None,
    explicit: dict[str, ast.expr],
) -> None:
    flags = [f for f in flags if f not in parser._option_string_actions]
    if not flags:
        return
    act = explicit.get("action")
    act_name = getattr(act, "attr", None) or getattr(act, "value", None)
    if act_name == "BooleanOptionalAction":
        parser.add_argument(*flags, action=argparse.BooleanOptionalAction)
        return
    if act_name in ("store_true", "store_false"):
        parser.add_argument(*flags, action=act_name)
        return
    if field is None:  # an explicit add_argument: its `type=`
        typ = getattr(explicit.get("type"), "id", "str")
        parser.add_argument(*flags, type={"int": int, "float": float}.get(typ, str))
        return
    kind, arg = mod.kind(field.annotation)
    if kind == "dataclass":
        parser.add_argument(*flags, type=_json_of(mod, arg, flags[0]))
    elif kind == "optional-bool":
        parser.add_argument(*flags, nargs="?", const=True)
    elif kind == "bool":
        parser.add_argument(*flags, action=argparse.BooleanOptionalAction)
    elif kind == "choices":
        parser.add_argument(*flags, choices=[str(c) for c in arg], type=str)
    elif kind == "list":
        parser.add_argument(*flags, nargs="+")
    elif kind in ("int", "float"):
        parser.add_argument(*flags, type=_number(int if kind == "int" else float, _bounds(field), flags[0]))
    else:
        parser.add_argument(*flags)


def _add_argument_calls(fn: ast.FunctionDef, mod: _Module, parser: argparse.ArgumentParser) -> None:
    """Replay the `add_argument` calls of one vLLM `add_cli_args`/`make_arg_parser` function."""
    sources: dict[str, tuple[str, str | None]] = {}  # kwargs variable -> (config class, field or None)

    def source(expr: ast.expr) -> ast.AnnAssign | None:
        if (
            isinstance(expr, ast.Subscript)
            and isinstance(expr.value, ast.Name)
            and isinstance(expr.slice, ast.Constant)
        ):
            cls, _ = sources.get(expr.value.id, (None, None))
            return mod.fields(cls).get(expr.slice.value) if cls in mod.classes else None
        if isinstance(expr, ast.Name) and expr.id in sources:
            cls, name = sources[expr.id]
            return mod.fields(cls).get(name) if cls in mod.classes and name else None
        if isinstance(expr, ast.Dict):
            return next(
                (f for k, v in zip(expr.keys, expr.values, strict=True) if k is None and (f := source(v))), None
            )
        return None

    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v, field = node.value, None
            if isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant):
                v, field = v.value, v.slice.value
            if isinstance(v, ast.Call) and getattr(v.func, "id", None) == "get_kwargs" and v.args:
                sources[node.targets[0].id] = (getattr(v.args[0], "id", ""), field)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "add_argument"]
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not flags or not flags[0].startswith("-"):
            continue  # positional (the model tag) or built from a loop variable
        field = next((f for k in call.keywords if k.arg is None and (f := source(k.value))), None)
        _add(parser, mod, flags, field, {k.arg: k.value for k in call.keywords if k.arg})


@functools.lru_cache(maxsize=2)
def vllm_parser(root: Path | None = None) -> argparse.ArgumentParser:
    """An argparse parser with every `vllm serve` flag as vLLM's definitions declare it."""
    root = root or vllm_source()
    files = sorted((root / "vllm" / "config").glob("*.py"))
    frontend = root / "vllm" / "entrypoints" / "common" / "cli_args.py"
    arg_utils = root / "vllm" / "engine" / "arg_utils.py"
    mod = _Module([*files, frontend, arg_utils])
    parser = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False, add_help=False, allow_abbrev=False)
    parser.add_argument("model_tag", nargs="?")
    funcs = {
        n.name: n
        for path in (frontend, arg_utils)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name in ("make_arg_parser",)
    }
    if "make_arg_parser" not in funcs:
        raise EngineArgsMissing(f"{frontend}: no make_arg_parser (a vLLM other than {VERSION}?)")
    _add_argument_calls(funcs["make_arg_parser"], mod, parser)
    for name, field in mod.fields("FrontendArgs").items():  # FrontendArgs.add_cli_args: every field
        _add(parser, mod, ["--" + name.replace("_", "-")], field, {})
    for cls in ("EngineArgs", "AsyncEngineArgs"):
        tree = ast.parse(arg_utils.read_text())
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
        _add_argument_calls(fn, mod, parser)
    return parser


def check_vllm(argv: list[str], root: Path | None = None) -> argparse.Namespace:
    """Parse the arguments after `vllm serve`; ValueError names what vLLM would reject."""
    return parse_strictly(vllm_parser(root), argv, f"vLLM {VERSION}")
