"""Exceptions that the command line turns into exit codes.

A `UserError` is a mistake in what the user asked for (a bad path, a wrong column, a bad number):
the command prints it as one line `Error: ...` and exits 1, having written nothing. Anything else
is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; printed as one line, exit code 1."""


class CheckFailed(Exception):
    """A check failed after the artifact was written; exit code 3."""

    def __init__(self, message: str, output: str | None = None):
        super().__init__(message)
        self.output = output
