"""docs/customization.md shows the test plug-ins themselves: every Python block of the page is the source of the
plug-in it defines (tests/support/rollout_plugins.py), so an example the tests run is the example a reader copies."""

from __future__ import annotations

import inspect
import re

from tests.support import rollout_plugins
from tests.support.runs import ROOT

BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
DEFINES = re.compile(r"^(?:async )?def (\w+)\(", re.MULTILINE)


def test_every_example_is_a_test_plugin_verbatim():
    blocks = BLOCK.findall((ROOT / "docs" / "customization.md").read_text())
    assert len(blocks) >= 6
    for block in blocks:
        name = DEFINES.search(block).group(1)
        assert block == inspect.getsource(getattr(rollout_plugins, name)), f"docs/customization.md's {name} differs"


def test_every_rollout_hook_has_its_section_with_slime_flag():
    text = (ROOT / "docs" / "customization.md").read_text()
    for key, flag in (("rollout.rollout_function", "--rollout-function-path"),
                      ("rollout.custom_generate", "--custom-generate-function-path"),
                      ("rollout.rollout_sample_filter", "--rollout-sample-filter-path"),
                      ("rollout.rollout_all_samples_process", "--rollout-all-samples-process-path"),
                      ("rollout.rollout_data_postprocess", "--rollout-data-postprocess-path"),
                      ("rollout.custom_convert_samples_to_train_data", "--custom-convert-samples-to-train-data-path")):
        assert re.search(rf"^## \d+\. .*`{re.escape(key)}` \(slime `{re.escape(flag)}`\)$", text, re.MULTILINE), key


def test_every_example_command_composes_and_validates():
    """The command under each example, as a user types it, passes validation (the plug-in imports and binds)."""
    from slime_hydra.app.preflight import compose_run

    commands = re.findall(r"^`slime-hydra '([^`]*)'`$", (ROOT / "docs" / "customization.md").read_text(), re.MULTILINE)
    assert len(commands) >= 6
    for override in commands:
        compose_run([override])  # raises ConfigError with every problem otherwise
