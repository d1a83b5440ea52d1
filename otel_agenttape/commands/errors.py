"""What a command raises for the user, and the exit codes every command returns.

Exit codes: 0 success, 1 the command ran and found a problem (for example a tape that does not verify),
2 usage or input error (bad arguments, unreadable file, bad query). ``cli.main`` prints a ``CliError`` as
one line and exits 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """An error shown to the user as one line, exiting with ``EXIT_USAGE``."""


@contextmanager
def reported(*types: type[BaseException]) -> Iterator[None]:
    """Turn an exception of ``types`` raised inside into a ``CliError`` with its text; a closed output pipe
    (``| head``) passes through, and ``cli.main`` exits 0 for it."""
    try:
        yield
    except BrokenPipeError:
        raise
    except types as exc:
        raise CliError(str(exc)) from None
