"""docs/customization.md shows the code the tests run: its first python blocks are the test plug-in modules' imports,
each other python block is the source of the plug-in it defines (tests/support/rollout_plugins.py, step_hooks.py,
plugins.py, or the built-in filter of slime_hydra/data/buffer.py), every hook key is in a numbered heading beside its
slime flag, and every command on the page, as a user types it, passes validation."""

from __future__ import annotations

import ast
import inspect
import re
import shlex

import slime_hydra.data.buffer as builtin_filters
import tests.support.plugins as plugins
import tests.support.rollout_plugins as rollout_plugins
import tests.support.step_hooks as step_hooks
from slime_hydra.config.checks_hooks import STEP_HOOKS
from tests.support.runs import ROOT

DOC = ROOT / "docs" / "customization.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
COMMAND = re.compile(r"```bash\n(slime-hydra .*?)```", re.S)
HEADING = re.compile(r"^## (\d+)\. (.*)$", re.M)
KEY_FLAG = re.compile(r"`([a-z_]+\.[a-z_]+)` \(slime `(--[a-z-]+)`\)")
MODULES = (rollout_plugins, step_hooks, plugins, builtin_filters)
ROLLOUT_HOOKS = {"rollout.rollout_function": "--rollout-function-path",
                 "rollout.custom_generate": "--custom-generate-function-path",
                 "rollout.rollout_sample_filter": "--rollout-sample-filter-path",
                 "rollout.rollout_all_samples_process": "--rollout-all-samples-process-path",
                 "rollout.rollout_data_postprocess": "--rollout-data-postprocess-path",
                 "rollout.custom_convert_samples_to_train_data": "--custom-convert-samples-to-train-data-path"}
OTHER_HOOKS = {"reward.custom_rm": "--custom-rm-path",
               "rollout.dynamic_sampling_filter": "--dynamic-sampling-filter-path",
               "rollout.buffer_filter": "--buffer-filter-path",
               "algorithm.custom_loss": "--custom-loss-function-path"}


def defining_module(name: str):
    """The one plug-in module that defines `name` itself (not one that imports it)."""
    found = [m for m in MODULES if getattr(getattr(m, name, None), "__module__", None) == m.__name__]
    assert len(found) == 1, f"{name} is defined in {[m.__name__ for m in found]}, not in exactly one plug-in module"
    return found[0]


def split_blocks() -> tuple[list[str], list[str]]:
    """The page's python blocks: the leading imports-only ones, then the rest."""
    blocks = BLOCK.findall(DOC.read_text())
    n = next(i for i, b in enumerate(blocks) if not all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in ast.parse(b).body))
    return blocks[:n], blocks[n:]


def test_the_imports_blocks_are_the_plug_in_modules_heads():
    imports, _ = split_blocks()
    assert len(imports) == 2
    for module, block in zip((rollout_plugins, step_hooks), imports):
        assert "\n" + block + "\n" in inspect.getsource(module), f"the imports block differs from {module.__name__}'s"


def test_every_python_example_is_a_tested_plug_ins_source():
    _, blocks = split_blocks()
    names = [ast.parse(b).body[0].name for b in blocks]
    assert len(names) == len(set(names)), names
    for name, block in zip(names, blocks):
        module = defining_module(name)
        assert block == inspect.getsource(getattr(module, name)), f"docs/customization.md's {name} differs from {module.__name__}"
    by_module = {m.__name__: [n for n in names if defining_module(n) is m] for m in MODULES}
    assert len(by_module[rollout_plugins.__name__]) >= 6
    assert len(by_module[step_hooks.__name__]) == 11, by_module[step_hooks.__name__]
    assert sorted(by_module[plugins.__name__]) == ["digit_reward", "newest_first", "reinforce_surrogate"]
    assert by_module[builtin_filters.__name__] == ["check_reward_nonzero_std"]


def test_sections_follow_slimes_numbers_and_name_each_key_with_its_slime_flag():
    headings = HEADING.findall(DOC.read_text())
    assert [int(n) for n, _ in headings] == list(range(1, 20))
    named = {key: flag for _, title in headings for key, flag in KEY_FLAG.findall(title)}
    for key in STEP_HOOKS:
        assert named.get(key) == "--" + key.split(".")[1].replace("_", "-") + "-path", key
    for key, flag in (ROLLOUT_HOOKS | OTHER_HOOKS).items():
        assert named.get(key) == flag, key
    for key in ROLLOUT_HOOKS:  # a rollout hook's heading is its own
        assert any(title.endswith(f"`{key}` (slime `{ROLLOUT_HOOKS[key]}`)") for _, title in headings), key


def test_the_overview_table_gives_each_section_its_flags_and_keys():
    """The table at the top lists, row by row, the slime flags and keys of the numbered sections."""
    text = DOC.read_text()
    rows = re.findall(r"^\| (\d+) \| (.*?) \| (.*?) \|$", text, re.M)
    assert [int(n) for n, _, _ in rows] == list(range(1, 20))
    titles = dict(HEADING.findall(text))
    for n, flags, keys in rows:
        pairs = KEY_FLAG.findall(titles[n])
        assert re.findall(r"`(--[a-z-]+)`", flags) == re.findall(r"`(--[a-z-]+)`", titles[n]), n
        assert re.findall(r"`([a-z_]+\.[a-z_]+)`", keys) == [k for k, _ in pairs], n
        assert pairs or keys.startswith("not here"), n


def test_every_example_command_composes_and_validates():
    """Each command, as a user types it, passes validation (every plug-in imports and binds), and each example
    plug-in is named by one of them."""
    from slime_hydra.app.preflight import compose_run

    commands = [shlex.split(c.replace("\\\n", " ")) for c in COMMAND.findall(DOC.read_text())]
    assert len(commands) >= 17
    for argv in commands:
        assert argv[0] == "slime-hydra"
        compose_run(argv[1:])  # raises ConfigError with every problem otherwise
    targets = " ".join(a for argv in commands for a in argv)
    for block in split_blocks()[1]:
        name = ast.parse(block).body[0].name
        assert f"{defining_module(name).__name__}.{name}" in targets, f"no command runs the example {name}"
