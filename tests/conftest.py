"""Shared fixtures: a free loopback port and the venv's console scripts."""

from __future__ import annotations

import pathlib
import socket
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = pathlib.Path(sys.executable).parent


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def venv_bin() -> pathlib.Path:
    """Folder of the running interpreter's console scripts (rasd-agent, rasctl, ...)."""
    return VENV_BIN


@pytest.fixture
def repo_root() -> pathlib.Path:
    """The repository checkout."""
    return REPO_ROOT
