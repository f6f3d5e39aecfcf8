"""`python -m slime_hydra.rollout.sglang.keyed MODULE ARGS...`: runs an SGLang server or the router with this run's
API key, which stays off the command line.

The key comes in the environment (endpoint.KEY_ENV, taken out before the server starts its own children), goes to
the module's arguments inside this process (`--api-key` and, for a server, `--admin-api-key`: the same key opens the
admin endpoints, which weight sync and memory release use), and is masked in what the process prints (SGLang logs
its ServerArgs, key included). /proc/<pid>/cmdline, which every user of the node can read, never holds it.
"""

from __future__ import annotations

import os
import runpy
import sys

from slime_hydra.rollout.sglang.endpoint import KEY_ENV

FLAGS = {"sglang.launch_server": ("--api-key", "--admin-api-key"), "sglang_router.launch_router": ("--api-key",)}


class Masked:
    """A text stream that writes through to `stream` with `secret` masked (a logging record is one write)."""

    def __init__(self, stream, secret: str):
        self._stream, self._secret = stream, secret

    def write(self, text: str) -> int:
        self._stream.write(text.replace(self._secret, "***"))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    key = os.environ.pop(KEY_ENV, "")
    if module not in FLAGS or not key:
        sys.exit(f"usage: {KEY_ENV}=<key> python -m slime_hydra.rollout.sglang.keyed {{{','.join(FLAGS)}}} ARGS...")
    sys.stdout, sys.stderr = Masked(sys.stdout, key), Masked(sys.stderr, key)
    sys.argv = [module, *args, *[f"{flag}={key}" for flag in FLAGS[module]]]  # one token: a key may begin with "-"
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
