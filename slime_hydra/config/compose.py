"""Compose configs and check each override against the schema, reporting every problem at once.

Hydra alone stops at the first bad override with its own message. Here each override is checked
against the schema (unknown keys and group options get the nearest valid names, also for `+key=`),
type errors are collected per override, and a multirun's overrides expand into every job's. Deriving and
checking the composed RunConfig, and the preflight of every job, are the composition floor's (app/preflight.py),
so a typo in the tenth sweep value fails before a cluster or a model starts.
"""

from __future__ import annotations

import difflib
import itertools
import os
from typing import Any, Iterable, Optional

from omegaconf import DictConfig, OmegaConf

from slime_hydra.config.schema import RunConfig
from slime_hydra.config.store import CONF_DIR, register

MAX_SWEEP_JOBS_CHECKED = 64


def _is_hydra_override(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out.extend(_leaf_paths(node._get_node(k), path))
    return out


def _conf_listing() -> tuple:
    """conf/'s directories and file names (experiment/ followed): what Hydra's groups and options are read from."""
    return tuple(sorted((d, tuple(sorted(files))) for d, _, files in os.walk(CONF_DIR, followlinks=True)))


# conf/'s listing -> its groups and each group's options, for the life of the process. Hydra answers each ask with a
# fresh config repository, deep copies and all: without this, the asks took about 40% of a compose_run of an
# experiment (a sweep's preflight asks again for every job). Keyed on the listing (~0.2 ms to read), so an option file
# written meanwhile is seen.
_LISTED: dict[tuple, dict[str, Any]] = {}


class Composer:
    """Composes configs from conf/ with the project's schemas registered."""

    def __init__(self, config_name: str = "config"):
        register()
        from hydra import initialize_config_dir

        self._ctx = initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="slime_hydra")
        self._ctx.__enter__()
        self.config_name = config_name
        listing = _conf_listing()
        if listing not in _LISTED:
            _LISTED.clear()  # an older listing's answers are stale
            _LISTED[listing] = {}
        self._listed = _LISTED[listing]

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)

    def __enter__(self) -> "Composer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def compose(self, overrides: list[str]) -> DictConfig:
        from hydra import compose

        return compose(config_name=self.config_name, overrides=overrides)

    def group_options(self, group: str) -> list[str]:
        key = f"options:{group}"
        if key not in self._listed:
            from hydra.core.global_hydra import GlobalHydra

            loader = GlobalHydra.instance().config_loader()
            options = list(loader.get_group_options(group))
            for sub in loader.list_groups(group):  # nested options such as experiment=<family>/<name>
                options += [f"{sub}/{o}" for o in self.group_options(f"{group}/{sub}")]
            self._listed[key] = sorted(options)
        return list(self._listed[key])

    def choices(self) -> dict[str, str]:
        """group -> the option the primary config picks (Hydra's runtime choices), user groups only."""
        from hydra import compose

        picked = compose(config_name=self.config_name, return_hydra_config=True).hydra.runtime.choices
        return {g: str(o) for g, o in picked.items() if g in self.groups()}

    def groups(self) -> set[str]:
        if "groups" not in self._listed:
            from hydra.core.global_hydra import GlobalHydra

            loader = GlobalHydra.instance().config_loader()
            self._listed["groups"] = frozenset(g for g in loader.list_groups("") if g not in ("hydra", "schema"))
        return set(self._listed["groups"])


def _nearest(word: str, candidates: Iterable[str], n: int = 3) -> str:
    cands = [c for c in dict.fromkeys(candidates) if c != word and not word.startswith(c + ".")]
    close = difflib.get_close_matches(word, cands, n=n, cutoff=0.5)
    if not close:  # match on the last path component too: `rollout_batch_size` -> `rollout.rollout_batch_size`
        leaf = word.split(".")[-1]
        close = [c for c in cands if c.split(".")[-1] == leaf][:n] or difflib.get_close_matches(leaf, cands, n=n, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _check_key(base: DictConfig, key: str, all_paths: list[str]) -> Optional[str]:
    """None if `key` names a schema field (or an entry of a free-form dict field)."""
    parts = key.split(".")
    node: Any = base
    for i, part in enumerate(parts):
        if isinstance(node, DictConfig) and node._is_none():  # an unset Optional[dict] field, e.g. reward.custom_rm
            return None
        if not isinstance(node, DictConfig):
            return f"unknown key {key!r}: {'.'.join(parts[:i])} is not a config node{_nearest(key, all_paths)}"
        if part in node:
            node = node._get_node(part)
            continue
        if node._metadata.object_type in (dict, None) and i > 0:  # a free-form dict field: new keys are fine
            return None
        scope = ".".join(parts[:i]) or "the top level"
        siblings = [f"{'.'.join(parts[:i])}.{k}" if i else str(k) for k in node.keys()]
        return f"unknown key {key!r} (no field {part!r} in {scope}){_nearest(key, siblings + all_paths)}"
    return None


def check_overrides(composer: Composer, overrides: list[str]) -> tuple[Optional[DictConfig], list[str]]:
    """Compose one job's overrides; returns (config or None, problems)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    problems: list[str] = []
    parsed = OverridesParser.create().parse_overrides(overrides)
    groups = composer.groups()
    group_ovr, key_ovr = [], []
    changes_only = True  # no key is added (+, ++) or deleted (~): those are checked against the config without them
    for text, o in zip(overrides, parsed):
        key = o.key_or_group
        if _is_hydra_override(key):
            continue
        if key in groups or key.split("@")[0] in groups:
            group = key.split("@")[0]
            value = o.value()
            options = composer.group_options(group)
            if o.is_delete() or value is None or value in options:
                group_ovr.append(text)
            else:
                problems.append(f"{group}={value}: no such option in conf/{group}/; options: {options}{_nearest(str(value), options)}")
        else:
            key_ovr.append((text, key))
            changes_only = changes_only and not (o.is_add() or o.is_force_add() or o.is_delete())
    if key_ovr and changes_only and not problems:
        try:  # the usual case: each key override changes a value that exists, which Hydra itself refuses otherwise
            return composer.compose(group_ovr + [text for text, _ in key_ovr]), problems
        except Exception:  # noqa: BLE001 - each culprit is found and named below
            pass
    try:
        base = composer.compose(group_ovr)
    except Exception as e:  # noqa: BLE001 - a broken option file; report it with the others
        return None, problems + [f"composing {group_ovr or 'the defaults'} failed: {hydra_message(e)}"]
    if not key_ovr:
        return base, problems
    all_paths = _leaf_paths(base)
    known = []
    for text, key in key_ovr:
        bad = _check_key(base, key, all_paths)
        if bad:
            problems.append(bad)
        else:
            known.append((text, key))
    try:  # the usual case: one compose for all of them (a compose costs ~0.4 s)
        return composer.compose(group_ovr + [text for text, _ in known]), problems
    except Exception:  # noqa: BLE001 - find the culprits below, each composed alone on the groups' config
        pass
    good = []
    for text, key in known:
        try:
            composer.compose(group_ovr + [text])
            good.append(text)
        except Exception as e:  # noqa: BLE001
            msg = hydra_message(e)
            if "is not in struct" in msg:
                msg += f"; to fill a free-form dict use +{key}.<name>=<value> or ++{key}={{...}}"
            problems.append(f"{text}: {msg}")
    return composer.compose(group_ovr + good), problems


def hydra_message(e: Exception) -> str:
    """The innermost useful sentence of a Hydra/OmegaConf error, without its object dump."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    msg = " ".join(str(e).split())
    return msg.split(" full_key:")[0].split(" object_type=")[0]


def to_run_config(cfg: DictConfig) -> RunConfig:
    """DictConfig -> typed RunConfig (interpolations resolved), minus Hydra's own node."""
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"]) if "hydra" in cfg else cfg
    return OmegaConf.to_object(cfg)


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """Multirun overrides -> the override list of each job (choice and range sweeps expanded)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    axes: list[list[str]] = []
    for text, o in zip(overrides, parsed):
        if o.is_sweep_override() and not o.is_interval_sweep():
            key = o.get_key_element()
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        elif o.is_interval_sweep():
            continue  # a continuous range for an optimizer sweeper: validated at its default
        else:
            axes.append([text])
    jobs = [list(combo) for combo in itertools.islice(itertools.product(*axes), MAX_SWEEP_JOBS_CHECKED)]
    return jobs or [[]]


__all__ = ["Composer", "check_overrides", "expand_sweeps", "hydra_message", "to_run_config"]
