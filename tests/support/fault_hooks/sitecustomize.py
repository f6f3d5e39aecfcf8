"""Faults injected into a real run by tests/engine/test_checkpoint.py: Python imports this module at start-up when
this directory is on PYTHONPATH, so the run under test is the unchanged `slime-hydra` command.

SLIME_HYDRA_TEST_FSYNC_DELAY_S=<seconds>: every os.fsync sleeps that long first, which stretches a checkpoint
save (one fsync per file and directory) from milliseconds to a window a test can SIGKILL the run inside.
"""

import os

if _delay := float(os.environ.get("SLIME_HYDRA_TEST_FSYNC_DELAY_S") or 0):
    import time

    _fsync = os.fsync

    def _slow_fsync(fd):
        time.sleep(_delay)
        return _fsync(fd)

    os.fsync = _slow_fsync
