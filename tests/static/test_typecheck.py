"""Static conformance: every backend class implements every method of its Protocol (slime_hydra/protocols.py).

mypy checks tests/static/typecheck/conformance.py, which assigns each backend class to its Protocol; a method missing
or declared with an incompatible signature is an error there. A planted class without `abort` shows the check
fails on exactly that. One mypy run checks both files (each run reads the package's modules again).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "static" / "typecheck" / "mypy.ini"


def mypy(*files: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG), *map(str, files)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


NO_ABORT = '''from slime_hydra.protocols import RolloutBackend


class NoAbort:
    weight_version = 0
    cooperative = False

    async def generate(self, samples, sampling):
        return samples

    def update_weights(self, named_tensors, version):
        pass

    def metrics(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def shutdown(self):
        pass


backend: RolloutBackend = NoAbort()
'''


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[int, str]:
    """mypy's exit code and output for the shipped conformance file and the planted class, checked together."""
    planted = tmp_path_factory.mktemp("typecheck") / "no_abort.py"
    planted.write_text(NO_ABORT)
    return mypy(ROOT / "tests" / "static" / "typecheck" / "conformance.py", planted)


def test_every_backend_conforms_to_its_protocol(checked):
    rc, out = checked
    # the one error is the planted file's (next test): the conformance file has none
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert errors and all(line.split(":", 1)[0].endswith("no_abort.py") for line in errors), out
    assert "Found 1 error in 1 file (checked 2 source files)" in out, out


def test_a_backend_missing_a_method_fails_the_check(checked):
    rc, out = checked
    assert rc == 1, out
    assert ('no_abort.py:27: error: Incompatible types in assignment (expression has type "NoAbort", variable has type '
            '"RolloutBackend")') in out, out
    assert 'note: "NoAbort" is missing following "RolloutBackend" protocol member:' in out and "note:     abort" in out, out
