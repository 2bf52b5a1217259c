"""Check SGLang command lines against SGLang's own argument definitions, without importing SGLang.

SGLang defines its server's command line as annotated fields (`sglang/srt/arg_groups/fields/*.py`:
`tp_size: A[int, Arg(help=..., aliases=["--tensor-parallel-size"])] = 1`) and builds its argparse
parser from them (`arg_utils.add_cli_args_from_dataclass`: `--` + the field name with dashes, the
aliases, `Literal[...]` as choices, `bool` as a switch). Importing that module pulls in PyTorch
and CUDA, which a CPU-only machine lacks, so `sglang_parser` reads the same files of the
installed package (`pip install --no-deps sglang==<version>`) with `ast` and builds an argparse
parser by the same rules. A flag the engine renames or drops, a choice it removes, or a number
where it wants a word then fails to parse, as it would fail to launch. (The faster check
`benchmarks/deploy_bench.py` uses; `deployment.engines.sglang.check` runs SGLang's own resolution.)
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
from pathlib import Path

from deployment.engines.base import EngineArgsMissing, parse_strictly
from deployment.engines.sglang.launch import VERSION


def sglang_fields_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise EngineArgsMissing(f"sglang is not installed: pip install --no-deps 'sglang=={VERSION}'")
    path = Path(next(iter(spec.submodule_search_locations))) / "srt" / "arg_groups" / "fields"
    if not path.is_dir():
        raise EngineArgsMissing(f"{path}: this sglang keeps no argument fields there (a version before 0.5.2x?)")
    return path


def sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def _arg_meta(node: ast.expr) -> dict[str, ast.expr]:
    """Keyword arguments of an `Arg(...)` call inside `A[...]`."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Arg":
        return {k.arg: k.value for k in node.keywords if k.arg}
    return {}


def _literal(node: ast.expr) -> list[object] | None:
    """The values of `Literal[...]` (inside Optional[...] too), else None."""
    if isinstance(node, ast.Subscript):
        name = getattr(node.value, "id", None)
        if name == "Literal":
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [e.value for e in elts if isinstance(e, ast.Constant)]
        if name == "Optional":
            return _literal(node.slice)
    return None


def _base(node: ast.expr) -> str:
    """`int`, `float`, `str`, `bool`, `list` or `other` for an annotation."""
    if isinstance(node, ast.Name):
        return node.id if node.id in ("int", "float", "str", "bool") else "other"
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in ("Optional",):
        return _base(node.slice)
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in ("list", "List"):
        return "list"
    return "other"


@functools.lru_cache(maxsize=1)
def sglang_parser() -> argparse.ArgumentParser:
    """An argparse parser with every SGLang server flag as its field definitions declare it."""
    parser = argparse.ArgumentParser(
        prog="sglang.launch_server", exit_on_error=False, add_help=False, allow_abbrev=False
    )
    seen: set[str] = set()
    for path in sorted(sglang_fields_dir().glob("*.py")):
        for cls in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                    continue
                ann = stmt.annotation
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                    continue
                parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                meta = _arg_meta(parts[1]) if len(parts) > 1 else {}
                if isinstance(meta.get("no_cli"), ast.Constant) and meta["no_cli"].value:
                    continue
                name = stmt.target.id
                cli = meta["cli_name"].value if isinstance(meta.get("cli_name"), ast.Constant) else None
                names = [cli or "--" + name.replace("_", "-")]
                if isinstance(meta.get("aliases"), ast.List):
                    names += [e.value for e in meta["aliases"].elts if isinstance(e, ast.Constant)]
                names = [n for n in names if n not in seen]
                if not names:
                    continue
                seen.update(names)
                kind, choices = _base(parts[0]), _literal(parts[0])
                if "action" in meta or kind == "bool":
                    parser.add_argument(*names, dest=name, action="store_true")
                elif choices is not None:
                    parser.add_argument(*names, dest=name, choices=[str(c) for c in choices])
                elif kind in ("int", "float"):
                    parser.add_argument(*names, dest=name, type=int if kind == "int" else float)
                else:
                    parser.add_argument(*names, dest=name, nargs="+" if kind == "list" else None)
    return parser


def check_sglang(argv: list[str]) -> argparse.Namespace:
    """Parse a `python -m sglang.launch_server` argument list; ValueError names what SGLang would reject."""
    return parse_strictly(sglang_parser(), argv, f"SGLang {sglang_version()}")
