"""Secrets out of what a run writes down: the composed config, its overrides, a server's command line.

What counts as a secret: the userinfo of a URL (`https://user:pass@host` -> `https://***@host`) and the value of a
query parameter with a secret's name; the value of any key whose name looks like a secret (`secret`, `password`,
`credential`, a `token` (HF_TOKEN, auth_token), an API / access / private key; not `input_key` or `max_tokens`,
which name fields and counts); every value of `rollout.sglang_env` (the engines' environment: HF_TOKEN and the like,
whatever they are called). Each is replaced by `***`. The composed config (composed_config.yaml, the tracker's params
and artifacts), the overrides (tags, run_info.json, Hydra's own `.hydra/` files) and server command lines in their
logs are written through here. The secrets found in a config also scrub any free text that repeats them.

Not covered: a secret a user puts in a value under a name that does not look like one (`reward.rm_type=<token>`),
or in an error message of their own code.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

MASK = "***"
ENV_KEYS = ("rollout.sglang_env",)  # every value under these keys is a secret, whatever its name
SECRET_NAME = re.compile(r"secret|passw(or)?d|passphrase|credential|bearer|cookie|(^|[_.-])token$|^token$|"
                         r"(api|access|private|auth|signing|encryption|session)[_.-]?key|^key$", re.IGNORECASE)
USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"]+)@")
QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&#\s'\"]+)=(?P<value>[^&#\s'\"]*)")


def secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name.rsplit(".", 1)[-1].lstrip("+~")))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """URL userinfo and secret-named query values masked, then every string of `secrets` (longest first)."""
    text = USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = QUERY_PARAM.sub(lambda m: f"{m['sep']}{m['name']}={MASK}" if secret_name(m["name"]) and m["value"] else m[0],
                           text)
    for s in sorted(set(secrets), key=len, reverse=True):
        if len(s) >= 4:  # a one-letter "secret" would mask every occurrence of that letter
            text = text.replace(s, MASK)
    return text


def redact_config(tree: Any, path: str = "") -> Any:
    """A copy of a composed config (dicts, lists, scalars) with every secret masked."""
    if isinstance(tree, dict):
        return {k: _redact_value(f"{path}{k}", v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [redact_config(v, path) for v in tree]
    return redact_text(tree) if isinstance(tree, str) else tree


def _redact_value(key: str, value: Any) -> Any:
    if key in ENV_KEYS and isinstance(value, dict):
        return {k: MASK for k in value}
    if secret_name(key) and value is not None and not isinstance(value, (dict, list, bool)):
        return MASK
    return redact_config(value, key + ".")


def secrets_in(tree: Any, path: str = "") -> set[str]:
    """The secret strings of a composed config (to scrub free text that repeats them)."""
    found: set[str] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{path}{k}"
            if key in ENV_KEYS and isinstance(v, dict):
                found |= {str(x) for x in v.values() if x is not None}
            elif secret_name(key) and v is not None and not isinstance(v, (dict, list, bool)):
                found.add(str(v))
            else:
                found |= secrets_in(v, key + ".")
    elif isinstance(tree, list):
        for v in tree:
            found |= secrets_in(v, path)
    elif isinstance(tree, str):
        found |= {m["userinfo"] for m in USERINFO.finditer(tree)}
        found |= {m["value"] for m in QUERY_PARAM.finditer(tree) if secret_name(m["name"]) and m["value"]}
    return found


def redact_override(override: str) -> str:
    """`key=value` as typed on the command line (`+key=`, `++key=`, `~key` too), its value masked when it is a secret."""
    key, eq, value = override.partition("=")
    bare = key.lstrip("+~")
    if eq and (secret_name(bare) or any(bare == k or bare.startswith(k + ".") for k in ENV_KEYS)):
        return f"{key}={MASK}"
    return redact_text(override)


def redact_argv(argv: list[str], secrets: Iterable[str] = ()) -> list[str]:
    """A command line for a log: the value after a secret-named flag (`--api-key X`, `--token=X`) masked."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append(MASK)
            hide = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag.startswith("--") and secret_name(flag[2:].replace("-", "_")):
            out.append(f"{flag}={MASK}" if eq else arg)
            hide = not eq
            continue
        out.append(redact_text(arg, secrets))
    return out


def redact_yaml_file(path, secrets: Iterable[str]) -> None:
    """Rewrite a YAML file another tool wrote (Hydra's `.hydra/config.yaml`, `overrides.yaml`, `multirun.yaml`) with
    its secrets masked: key by key as a config, and every string scrubbed of `secrets`."""
    import os
    from pathlib import Path

    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return
    clean = _scrub(redact_config(data), list(secrets))
    if clean == data:
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(yaml.safe_dump(clean, sort_keys=False, allow_unicode=True))
    os.replace(tmp, path)


def _scrub(tree: Any, secrets: list[str]) -> Any:
    if isinstance(tree, dict):
        return {k: _scrub(v, secrets) for k, v in tree.items()}
    if isinstance(tree, list):
        return [redact_text(redact_override(v), secrets) if isinstance(v, str) else _scrub(v, secrets) for v in tree]
    return redact_text(tree, secrets) if isinstance(tree, str) else tree
