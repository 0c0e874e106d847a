"""Integration tests share fleetlib (a controller and agents on one event loop in a thread)."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
