"""Static conformance: every backend class implements every method of its Protocol (slime_hydra/protocols.py).

mypy checks tests/static/typecheck/conformance.py, which assigns each backend class to its Protocol; a method missing
or declared with an incompatible signature is an error there. A planted class without `abort` shows the check
fails on exactly that.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "static" / "typecheck" / "mypy.ini"


def mypy(*files: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG), *map(str, files)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


def test_every_backend_conforms_to_its_protocol():
    rc, out = mypy(ROOT / "tests" / "static" / "typecheck" / "conformance.py")
    assert rc == 0 and "Success: no issues found" in out, out


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


def test_a_backend_missing_a_method_fails_the_check(tmp_path):
    planted = tmp_path / "no_abort.py"
    planted.write_text(NO_ABORT)
    rc, out = mypy(planted)
    assert rc == 1, out
    assert ('no_abort.py:27: error: Incompatible types in assignment (expression has type "NoAbort", variable has type '
            '"RolloutBackend")') in out, out
    assert 'note: "NoAbort" is missing following "RolloutBackend" protocol member:' in out and "note:     abort" in out, out
