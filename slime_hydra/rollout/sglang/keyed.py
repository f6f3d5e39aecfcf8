"""`python -m slime_hydra.rollout.sglang.keyed MODULE ARGS...`: runs an SGLang server or the router with this run's
API key, which stays off the command line.

The key comes in the environment (endpoint.KEY_ENV, taken out before the server starts its own children), goes to
the module's arguments inside this process (`--api-key` and, for a server, `--admin-api-key`: the same key opens the
admin endpoints, which weight sync and memory release use), and is masked in what the process prints (SGLang logs
its ServerArgs, key included). /proc/<pid>/cmdline, which every user of the node can read, never holds it.

A CPU server (`--device cpu`) forks its scheduler and detokenizer instead of spawning them: they start with the
modules the server has already imported, where spawned ones import SGLang, transformers and torch again (an engine of
the tiny model answered /health after 16 s instead of 27 s on an idle two-core machine). SGLang asks for spawn because
CUDA cannot be forked; a CPU server holds no CUDA state, so its children are forked. A CPU server also leaves FlashInfer
(CUDA kernels only) unimported: SGLang imports it where it is optional (FP4 quantization, behind an ImportError), and
it was 1.7 of the 13.6 CPU-seconds a CPU server's imports took (`import sglang.launch_server,
sglang.srt.entrypoints.http_server` under /usr/bin/time, twice each way). Every server leaves scikit-learn unimported:
transformers imports its metrics, when installed, only for assisted generation's confidence threshold, which an SGLang
server never runs; that was 1.5 of the 15.2 CPU-seconds of the same imports (14.2 + 1.1 against 12.7 + 1.0, twice).
A router leaves SGLang's own package unimported unless it runs the Python load balancer (`--mini-lb`): the router is
Rust, and sglang_router imports SGLang only for that balancer's request tracing, which it skips when SGLang is not
installed. `import sglang_router.launch_router` took 8.7 CPU-seconds (7.3 user + 1.4 system) with it and 0.7 without.
"""

from __future__ import annotations

import multiprocessing
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


def forked_children() -> None:
    """SGLang's `multiprocessing.set_start_method("spawn", force=True)` gives fork instead (a CPU server only)."""
    choose = multiprocessing.set_start_method

    def fork_instead(method: str | None, force: bool = False) -> None:
        choose("fork", force=True)

    multiprocessing.set_start_method = fork_instead


def without_cuda_kernels() -> None:
    """FlashInfer reads as not installed (SGLang's optional imports of it then fall back), as nothing on CPU calls it."""
    sys.modules.setdefault("flashinfer", None)


def without_unused_libraries() -> None:
    """scikit-learn reads as not installed: transformers checks for it (importlib.util.find_spec gives None for a
    blocked name) and leaves its metrics unimported; nothing an SGLang server runs calls them."""
    sys.modules.setdefault("sklearn", None)


def without_sglang() -> None:
    """SGLang's package reads as not installed (a router's process: nothing it runs calls SGLang but mini_lb's tracing)."""
    sys.modules.setdefault("sglang", None)


def on_cpu(args: list[str]) -> bool:
    return any(a == "--device=cpu" or (a == "--device" and args[i + 1:i + 2] == ["cpu"]) for i, a in enumerate(args))


def main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    key = os.environ.pop(KEY_ENV, "")
    if module not in FLAGS or not key:
        sys.exit(f"usage: {KEY_ENV}=<key> python -m slime_hydra.rollout.sglang.keyed {{{','.join(FLAGS)}}} ARGS...")
    sys.stdout, sys.stderr = Masked(sys.stdout, key), Masked(sys.stderr, key)
    if module == "sglang.launch_server":
        without_unused_libraries()
        if on_cpu(args):
            forked_children()
            without_cuda_kernels()
    elif "--mini-lb" not in args:
        without_sglang()
    sys.argv = [module, *args, *[f"{flag}={key}" for flag in FLAGS[module]]]  # one token: a key may begin with "-"
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
