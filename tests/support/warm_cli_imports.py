"""What a CLI run imports before it reads its first override, preloaded once by tests/support/warm_cli.py's
forkserver. Importing more than a run needs is harmless (its children import on demand); nothing here starts a thread,
a process or a torch op, so a fork of it is a clean interpreter with warm modules."""

import matplotlib

matplotlib.use("Agg")  # as engine/report.py chooses it before pyplot

import matplotlib.pyplot  # noqa: E402,F401
import mlflow  # noqa: E402,F401
import transformers.modeling_utils  # noqa: E402,F401
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402,F401

import slime_hydra.app.session  # noqa: E402,F401
import slime_hydra.cli  # noqa: E402,F401
