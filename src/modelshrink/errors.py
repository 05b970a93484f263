"""Exceptions that the command line turns into exit codes.

A `UserError` is a mistake in what the user asked for (a bad path, a wrong column, a bad number, a damaged
export folder): the command prints it as one line `Error: ...` and exits 1, having written nothing. It is
the torch-free runtime's own error type, so that there is one class whether the runtime or a step raises it.
Anything else is a bug and keeps its traceback.
"""

from modelshrink.runtime.errors import UserError

__all__ = ["CheckFailed", "UserError"]


class CheckFailed(Exception):
    """A check failed after the artifact was written; exit code 3."""

    def __init__(self, message: str, output: str | None = None):
        super().__init__(message)
        self.output = output
