"""The exceptions the CLI turns into one line on stderr and an exit status.

UsageError     bad input: exit 2, before any output is written; every check on user input raises it.
RunFailed      a run that started but cannot go on (a diverging loss): exit 1.
Interrupted    SIGTERM or SIGINT reached a training job: it checkpointed and exits 128 + signal.
"""

import signal


class UsageError(Exception):
    """Bad input: an unknown name, an impossible setting, a corrupt file."""


class RunFailed(Exception):
    """A run that cannot continue; the message names where (round, client) and what to change."""


class Interrupted(BaseException):
    """A stop signal arrived. A BaseException, so no `except Exception` in method code swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # what a shell reports for a process killed by that signal
