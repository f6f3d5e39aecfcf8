"""Faults injected into a real run by tests/engine/test_checkpoint.py: Python imports this module at start-up when
this directory is on PYTHONPATH, so the run under test is the unchanged `slime-hydra` command.

SLIME_HYDRA_TEST_FSYNC_DELAY_S=<seconds>: every os.fsync sleeps that long first, which stretches a checkpoint
save (one fsync per file and directory) from milliseconds to a window a test can SIGKILL the run inside.
SLIME_HYDRA_TEST_FSYNC_HANG_ON=<text>: an os.fsync of a file or directory whose path contains <text> never returns
(a stuck filesystem; it sleeps in short naps, so the stall watchdog's interrupt of the main thread ends it).
"""

import os

if _delay := float(os.environ.get("SLIME_HYDRA_TEST_FSYNC_DELAY_S") or 0):
    import time

    _fsync = os.fsync

    def _slow_fsync(fd):
        time.sleep(_delay)
        return _fsync(fd)

    os.fsync = _slow_fsync

if _hang_on := os.environ.get("SLIME_HYDRA_TEST_FSYNC_HANG_ON"):
    import time

    _fsync_before_hang = os.fsync

    def _fsync_on_a_stuck_filesystem(fd):
        if _hang_on in os.readlink(f"/proc/self/fd/{fd}"):
            while True:
                time.sleep(0.2)
        return _fsync_before_hang(fd)

    os.fsync = _fsync_on_a_stuck_filesystem
