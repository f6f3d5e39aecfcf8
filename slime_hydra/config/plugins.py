"""Resolve a `_target_` plug-in node into a callable (validation has already bound its signature)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional


def load_target(node: Optional[dict[str, Any]]) -> Optional[Callable[..., Any]]:
    """{"_target_": "pkg.mod.fn", **kwargs} -> fn with kwargs bound; None for an unset node."""
    if not node:
        return None
    from hydra.utils import get_method

    fn = get_method(node["_target_"])
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    return functools.partial(fn, **kwargs) if kwargs else fn
