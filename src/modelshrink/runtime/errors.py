"""modelshrink's one user-error type (`modelshrink.errors` re-exports it, so the runtime needs nothing else).

A `UserError` is a mistake in what the user asked for or gave (a bad path, a wrong column, a damaged export
folder): every command, and the runtime's own command line, prints it as one line `Error: ...` and exits 1.
Anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input; printed as one line, exit code 1."""
