"""The step hooks' page of the customisation guide shows the test plug-ins exactly: each python example is the source of
the function or class of the same name in tests/support/step_hooks.py (which the hooks' tests run), and each hook key
is given beside its slime flag."""

from __future__ import annotations

import ast
import inspect
import re

import tests.support.step_hooks as examples
from slime_hydra.config.checks_hooks import STEP_HOOKS
from tests.support.runs import ROOT

DOC = ROOT / "docs" / "customization_rest.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_every_python_example_is_a_tested_plug_ins_source():
    """The first block is the plug-ins' imports, as their module has them; each other block one plug-in's source."""
    imports, *blocks = BLOCK.findall(DOC.read_text())
    source = inspect.getsource(examples)
    assert "\n" + imports + "\n" in source and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in ast.parse(imports).body)
    names = [ast.parse(b).body[0].name for b in blocks]
    assert len(names) == len(set(names)) == 11, names
    for name, block in zip(names, blocks):
        assert block == inspect.getsource(getattr(examples, name)), f"the example {name} differs from its plug-in"


def test_every_hook_key_is_named_with_its_slime_flag():
    text = DOC.read_text()
    for key in STEP_HOOKS:
        flag = "--" + key.split(".")[1].replace("_", "-") + "-path"
        assert re.search(rf"`{re.escape(key)}` \(slime `{flag}`\)", text), (key, flag)
