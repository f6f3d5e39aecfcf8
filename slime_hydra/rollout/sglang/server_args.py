"""SGLang's ServerArgs field names without importing sglang (~7 s), the pass-through check, the argv.

`rollout.sglang` maps ServerArgs fields to values (slime's `--sglang-<flag>`). The field names are read
with `ast` from the installed sources: sglang >= 0.5.2x declares them as annotated attributes of the
classes in `sglang/srt/arg_groups/fields/*.py`; older releases (0.5.17) as annotated attributes of the
`ServerArgs` dataclass in `sglang/srt/server_args.py`. Only if neither parse finds fields is sglang
imported. The same is done for the router's `RouterArgs` (`rollout.sglang_router`).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from pathlib import Path
from typing import Any, Iterable

# keys the runner sets itself (from model, cluster and seed): refused as pass-through overrides
RUNNER_KEYS = {
    "model_path": "the model comes from the model group (model.hf_checkpoint) and is saved for the engines by the runner",
    "tokenizer_path": "the tokenizer is saved with the model by the runner",
    "tp_size": "set cluster.rollout_num_gpus_per_engine (an engine's tensor-parallel size)",
    "port": "ports are picked free by the runner, one per engine",
    "host": "engines listen on 127.0.0.1 behind the router",
    "random_seed": "set seed (each engine gets seed + its index)",
    "api_key": "each run gives its engines a random key of its own, which every client sends (docs/security.md)",
    "admin_api_key": "each run gives its engines a random key of its own, which every client sends (docs/security.md)",
}
ROUTER_RUNNER_KEYS = {
    "worker_urls": "the runner passes the engines it started",
    "host": "the router listens on 127.0.0.1",
    "port": "the router port is picked free by the runner",
    "policy": "set rollout.sglang_router_policy",
    "api_key": "each run gives its router a random key of its own, which every client sends (docs/security.md)",
}


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec and spec.origin else None


def _annotated_names(tree: ast.AST, class_name: str | None = None) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (class_name is None or node.name == class_name):
            out |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and not s.target.id.startswith("_")}
    return out


@functools.lru_cache(maxsize=None)
def server_arg_fields() -> frozenset[str]:
    root = _package_dir("sglang")
    if root is None:
        return frozenset()
    names: set[str] = set()
    for f in sorted((root / "srt" / "arg_groups" / "fields").glob("*.py")):
        names |= _annotated_names(ast.parse(f.read_text()))
    if not names and (root / "srt" / "server_args.py").is_file():
        names = _annotated_names(ast.parse((root / "srt" / "server_args.py").read_text()), "ServerArgs")
    if not names:  # an unknown layout: pay for the import
        import dataclasses

        from sglang.srt.server_args import ServerArgs

        names = {f.name for f in dataclasses.fields(ServerArgs)}
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def router_arg_fields() -> frozenset[str]:
    root = _package_dir("sglang_router")
    if root is None or not (root / "router_args.py").is_file():
        return frozenset()
    return frozenset(_annotated_names(ast.parse((root / "router_args.py").read_text()), "RouterArgs"))


def check_pass_through(key: str, options: dict[str, Any], fields: Iterable[str], refused: dict[str, str],
                       what: str) -> list[str]:
    """Each problem names the key and the fix (nearest valid names for an unknown one)."""
    fields = set(fields)
    problems = []
    if not fields:
        return [f"{key}: {what} is not installed; install it or set rollout.backend=local"]
    for name in options:
        if name in refused:
            problems.append(f"{key}.{name} is set by the runner and cannot be overridden: {refused[name]}; remove {key}.{name}")
        elif name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(f'{key}.{c}' for c in close)}?" if close else ""
            problems.append(f"{key}.{name} is not a field of {what}{hint}")
    return problems


def to_argv(options: dict[str, Any]) -> list[str]:
    """{field: value} -> CLI flags: True -> --flag, False/None -> omitted, lists -> repeated values."""
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        elif isinstance(value, dict):
            import json

            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv
