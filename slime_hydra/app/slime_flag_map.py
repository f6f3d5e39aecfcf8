"""slime's flags beside this project's keys: the table docs/slime_flags.md is generated from, and its checks.

Three inputs: slime's flags and their defaults (`slime_arguments.json`, read from slime's arguments file at the
commit it names, by `extract`), what each flag is here (`slime_flag_map.yaml`: a key, or why it is not here, and why
a default differs), and the schema (config/schema.py), whose defaults are compared with slime's here, so a default that
differs without a reason, a key the schema lacks or a flag left out is a problem (tests/app/test_slime_flag_map.py).

    python -m slime_hydra.app.slime_flag_map                      # rewrite docs/slime_flags.md (make slime-flags)
    python -m slime_hydra.app.slime_flag_map extract FILE COMMIT  # rewrite slime_arguments.json from slime's file

Only facts are taken from slime's file: flag names, defaults and which of them re-declare a megatron flag; no help text.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from slime_hydra.config.schema import GROUP_SCHEMAS, RunConfig

HERE = Path(__file__).resolve().parent
FLAGS_FILE = HERE / "slime_arguments.json"
MAP_FILE = HERE / "slime_flag_map.yaml"
DOC = HERE.parents[1] / "docs" / "slime_flags.md"
SOURCE = "slime/utils/arguments.py"
NOT_SET = "(required)"  # a flag slime declares without a default: its runs must give it


# -- slime's side: the flags of its arguments file -------------------------------------------------------------------

def _value(node: ast.expr | None, kind: str | None) -> Any:
    """A default as Python would build it: a literal, arithmetic of literals, or a JSON string given to json.loads."""
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except ValueError:
        if not all(isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop))
                   for n in ast.walk(node)):
            return {"expression": ast.unparse(node)}
        value = eval(compile(ast.Expression(node), SOURCE, "eval"), {"__builtins__": {}})  # constants only (checked)
    return json.loads(value) if kind == "json.loads" and isinstance(value, str) else value


def extract(source: str) -> list[dict[str, Any]]:
    """Every flag the file declares (`parser.add_argument`, and `reset_arg`, which re-declares a megatron flag with
    slime's default), in the file's order: its name, the attribute it sets and its default."""
    flags: dict[str, dict[str, Any]] = {}
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    for call in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        fn = call.func
        megatron = isinstance(fn, ast.Name) and fn.id == "reset_arg"
        if not (megatron or isinstance(fn, ast.Attribute) and fn.attr == "add_argument"):
            continue
        names = [a.value for a in call.args[1 if megatron else 0:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not names or names[0] in flags:
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        action = ast.literal_eval(kw["action"]) if isinstance(kw.get("action"), ast.Constant) else None
        if "default" in kw:
            default = _value(kw["default"], ast.unparse(kw["type"]) if "type" in kw else None)
        else:
            default = {"store_true": False, "store_false": True}.get(action or "", None)
        if isinstance(kw.get("required"), ast.Constant) and kw["required"].value is True:
            default = NOT_SET
        dest = ast.literal_eval(kw["dest"]) if "dest" in kw else names[0].lstrip("-").replace("-", "_")
        flags[names[0]] = {"flag": names[0], "dest": dest, "default": default, "megatron": megatron}
    return list(flags.values())


def load_flags() -> dict[str, Any]:
    return json.loads(FLAGS_FILE.read_text())


def load_map() -> dict[str, Any]:
    return yaml.safe_load(MAP_FILE.read_text())


# -- this project's side: the schema's keys and defaults -------------------------------------------------------------

def schema_defaults() -> dict[str, Any]:
    """Every key of the schema (`rollout.n_samples_per_prompt`, `train.megatron.log_probs_chunk_size`, `seed`) and its
    default."""
    def walk(cls: type, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            sub = GROUP_SCHEMAS.get(f.name) if not prefix else type(value) if dataclasses.is_dataclass(value) else None
            if sub is not None:
                out |= walk(sub, f"{prefix}{f.name}.")
            else:
                out[prefix + f.name] = value
        return out
    return walk(RunConfig, "")


def _same(a: Any, b: Any) -> bool:
    """slime's default and ours mean the same: equal numbers, or both unset (None, an empty string, list or dict)."""
    def unset(v: Any) -> bool:
        return v is None or isinstance(v, (str, list, dict)) and not v

    if unset(a) and unset(b):
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def entries(fmap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The map's rows, a bare key written as `{key: ...}`."""
    return {flag: {"key": row} if isinstance(row, str) else dict(row) for flag, row in fmap["flags"].items()}


def keys_of(row: dict[str, Any]) -> list[str]:
    key = row.get("key")
    return [] if key is None else [key] if isinstance(key, str) else list(key)


def differing(flag: dict[str, Any], row: dict[str, Any], ours: dict[str, Any], pending: set[str]) -> bool | None:
    """Whether slime's default differs from the key's; None where there is nothing to compare (not here, a flag that
    sets a key to a value, a key still pending)."""
    keys = keys_of(row)
    if not keys or "value" in row or keys[0] in pending or keys[0] not in ours:
        return None
    return not _same(flag["default"], ours[keys[0]])


def problems(flags: list[dict[str, Any]], fmap: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """What keeps the map from being true: a flag of slime's list unmapped, a row for no flag, a key the schema lacks
    (unless pending), a pending key the schema has, a row both mapped and not here, or a default that differs without
    a reason (or a reason where none differs)."""
    rows, pending = entries(fmap), set(fmap.get("pending", []))
    names = [f["flag"] for f in flags]
    out = [f"{n}: no row in slime_flag_map.yaml (give its key, or not_here: why)" for n in names if n not in rows]
    out += [f"{n}: a row for a flag slime's list does not hold" for n in rows if n not in names]
    for flag in flags:
        row = rows.get(flag["flag"])
        if row is None:
            continue
        keys = keys_of(row)
        if bool(keys) == bool(row.get("not_here")):
            out.append(f"{flag['flag']}: give exactly one of key and not_here")
        for key in keys:
            if key in pending and key in ours:
                out.append(f"{flag['flag']}: {key} is in the schema now; remove it from `pending`")
            elif key not in pending and key not in ours:
                out.append(f"{flag['flag']}: {key} is not a key of the schema (config/schema.py)")
        diff = differing(flag, row, ours, pending)
        if diff and not row.get("why_default"):
            out.append(f"{flag['flag']}: slime's default {flag['default']!r} differs from {keys[0]}={ours[keys[0]]!r}; "
                       "say why in why_default")
        if diff is False and row.get("why_default"):
            out.append(f"{flag['flag']}: the defaults agree; drop why_default")
    return out


# -- the document ----------------------------------------------------------------------------------------------------

def _slime(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {"expression"}:
        return f"`{value['expression']}`"
    return "(required)" if value == NOT_SET else f"`{value!r}`"


def _ours(value: Any) -> str:
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _here(row: dict[str, Any]) -> str:
    if row.get("not_here"):
        return f"not here: {_cell(row['not_here'])}"
    keys = ", ".join(f"`{k}`" for k in keys_of(row))
    text = f"`{keys_of(row)[0]}={row['value']}`" if "value" in row else keys
    return text + (f" ({_cell(row['note'])})" if row.get("note") else "")


INTRO = """\
# slime's flags and their keys here

<!-- Generated by `make slime-flags` (python -m slime_hydra.app.slime_flag_map) from
slime_hydra/app/slime_arguments.json, slime_hydra/app/slime_flag_map.yaml and the schema; edit those, not this
file. tests/app/test_slime_flag_map.py keeps it equal to the script's output. -->

Every flag of slime's `{source}` at commit `{commit}` ({count} flags, in the file's order), and the key that
does the same here (`group.key=value` on the command line, or in an experiment file), or why it is not here. A key is
slime's flag without `--`, in the group that owns the step; a `-path` flag is a `_target_` node without `-path`
(`--custom-rm-path pkg.fn` is `reward.custom_rm={{_target_: pkg.fn}}`, with its keyword arguments beside it).
Flags marked *megatron* are megatron's own that slime's file declares again with its default; megatron's other flags
(model shape, parallelism, optimizer) carry the same names here under `model.`, `parallelism.` and `train.`.
slime's `--sglang-<name>` flags, made from SGLang's server arguments by its SGLang backend, are
`rollout.sglang.<name>` here (checked against SGLang's own fields).
"""


def render(flags_doc: dict[str, Any], fmap: dict[str, Any], ours: dict[str, Any]) -> str:
    flags, rows, pending = flags_doc["flags"], entries(fmap), set(fmap.get("pending", []))
    lines = [INTRO.format(source=flags_doc["source"], commit=flags_doc["commit"], count=len(flags)), ""]
    lines += ["## Defaults that differ from slime's", "",
              "| slime flag | slime's default | key here | default here | why |", "|---|---|---|---|---|"]
    for flag in flags:
        row = rows.get(flag["flag"], {})
        if differing(flag, row, ours, pending) or (row.get("why_default") and keys_of(row)):
            key = keys_of(row)[0]
            here = _ours(ours[key]) if key in ours else "`{}`"
            lines.append(f"| `{flag['flag']}` | {_slime(flag['default'])} | `{key}` | {here} | {_cell(row['why_default'])} |")
    lines += ["", "## Every flag", "", "| slime flag | slime's default | here |", "|---|---|---|"]
    for flag in flags:
        mark = " *megatron*" if flag["megatron"] else ""
        lines.append(f"| `{flag['flag']}`{mark} | {_slime(flag['default'])} | {_here(rows.get(flag['flag'], {'not_here': '?'}))} |")
    return "\n".join(lines) + "\n"


def document() -> str:
    return render(load_flags(), load_map(), schema_defaults())


def main(argv: list[str]) -> int:
    if argv[:1] == ["extract"] and len(argv) == 3:
        flags = extract(Path(argv[1]).read_text())
        rows = ",\n".join(f"  {json.dumps(f)}" for f in flags)  # one flag a line: a new slime commit diffs by flag
        FLAGS_FILE.write_text(f'{{"source": "{SOURCE}", "commit": "{argv[2]}", "flags": [\n{rows}\n]}}\n')
        print(f"wrote {FLAGS_FILE} ({len(flags)} flags)")
        return 0
    if argv:
        print(__doc__)
        return 2
    found = problems(load_flags()["flags"], load_map(), schema_defaults())
    if found:
        print("slime_flag_map.yaml is not true to the schema or to slime's flags:\n" + "\n".join(found), file=sys.stderr)
        return 2
    DOC.write_text(document())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
