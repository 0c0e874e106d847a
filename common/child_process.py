"""A helper interpreter on a socket pair: how the controller moves GIL-heavy work out of its process.

The store's commit writer (`rasd.controller.store.writer`) and the Kubernetes adapter
(`rasd.controller.executors.quarantine.k8s_process`) each run in a child started here and talk to it
with pickled messages over a `multiprocessing.connection.Connection`.

A plain child interpreter (``python -m module fd``), not multiprocessing's spawn: that re-imports the
parent's __main__, which a console script or pytest may not allow. Settings go over the socket, not
the command line, where `ps` would show a password or a token in them.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import socket
import subprocess
import sys
from typing import Any

from rasd.common import logging as rasd_logging


def spawn(module: str) -> tuple[subprocess.Popen[bytes], multiprocessing.connection.Connection]:
    """Start ``python -m module <fd>`` with one end of a socket pair; the child and this end of it.

    The child takes its end with ``multiprocessing.connection.Connection(int(sys.argv[1]))``.
    """
    ours, theirs = socket.socketpair()
    with ours, theirs:
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=child_environment(),
        )
        conn = multiprocessing.connection.Connection(ours.detach())
    return process, conn


def child_environment() -> dict[str, str]:
    """This process's environment, with the level it logs at for the child (`rasd_logging.configure_child`)."""
    return {**os.environ, rasd_logging.CHILD_LEVEL_VARIABLE: rasd_logging.configured_level()}


def pickled(*message: Any) -> bytes:
    """The message tuple pickled; an exception in it that does not pickle goes as a RuntimeError naming it."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps(tuple(_picklable(part) for part in message), protocol=pickle.HIGHEST_PROTOCOL)


def _picklable(value: Any) -> Any:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return RuntimeError(f"{type(value).__name__}: {value}")
    return value
