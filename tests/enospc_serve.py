"""`agenttape serve` with an injected full disk: while the file named by ``ENOSPC_FLAG`` exists, every
write the receiver makes with ``os.writev`` (the write-ahead log and its disk probe) fails with ENOSPC,
as on a full file system. Run as ``python tests/enospc_serve.py serve --db ...``."""

from __future__ import annotations

import errno
import os
import sys

_FLAG = os.environ["ENOSPC_FLAG"]
_writev = os.writev


def _full_writev(fd: int, buffers: list) -> int:
    if os.path.exists(_FLAG):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _writev(fd, buffers)


os.writev = _full_writev

if __name__ == "__main__":
    from otel_agenttape.cli import main

    sys.exit(main(sys.argv[1:]))
