"""`_target_` plug-in nodes at check time: `import_target` imports one and `check_target` also binds its signature to
the call the engine will make (both report problems). The composition floor turns a checked node into a callable
(app/plugins.py)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional


def import_target(key: str, node: dict[str, Any], problems: list[str], what: str = "a function") -> Optional[Callable[..., Any]]:
    """The node's `_target_` imported, or None with the problem (naming `key` and the fix) appended."""
    target = node.get("_target_")
    if not target:
        problems.append(f"{key} needs a _target_ (a dotted path to {what})")
        return None
    try:
        from hydra.utils import get_method

        return get_method(target)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        problems.append(f"{key}._target_={target} does not import ({type(e).__name__}: {e}); fix the dotted path")
        return None


def check_target(key: str, node: Optional[dict], n_positional: int, problems: list[str]) -> None:
    """A `_target_` plug-in must import, and its signature must take the call we will make."""
    if not node:
        return
    fn, target = import_target(key, node, problems), node.get("_target_")
    if fn is None:
        return
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    try:
        inspect.signature(fn).bind(*([None] * n_positional), **kwargs)
    except TypeError as e:
        problems.append(f"{key}._target_={target}: signature {inspect.signature(fn)} does not fit a call with "
                        f"{n_positional} positional argument(s) and {sorted(kwargs)} ({e})")
