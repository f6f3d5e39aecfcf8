"""User-facing errors. The CLI prints them without a traceback and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a config key, a data file, a path. The message names the fix."""

    exit_code = 2


class ConfigError(UserError):
    """One or more config problems, reported together."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} config error{'s' if n != 1 else ''}:"
        return "\n".join([head] + [f"  - {p}" for p in self.problems])


class Missing(str):
    """A problem that is only a path absent on this machine (a checkpoint or data file of the cluster a run is
    for): fatal for a run, listed and passed over by a plan (`slime-hydra plan`, app/plan.py)."""

    key: str
    path: str

    def __new__(cls, text: str, key: str, path: str) -> "Missing":
        self = super().__new__(cls, text)
        self.key, self.path = key, str(path)
        return self


class DataError(UserError):
    """A problem in a data file, with file:line."""


class RunError(Exception):
    """A run that stopped on a failure it can name (a stall, a timeout): the message says which step, which key
    controls it and where to resume. The CLI prints it without a traceback and exits with code 3."""

    exit_code = 3


class StallError(RunError):
    """The stall watchdog fired: no rollout step finished in time."""


class Interrupted(RunError):
    """The run stopped on a signal (SIGTERM, SIGINT) after a checkpoint: the exit code is 128 + the signal."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
