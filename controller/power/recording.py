"""Recording the power loop's periods, for replaying them through `period.step`.

A `PeriodRecorder` is a `PowerLoop.on_step` hook: it writes each period's state, inputs, time and
result (`core.power.snapshot` plain data) as one JSON line of a gzip file. `read` gives the records
back as values. A recorded field incident or test run then replays, period by period, to the same
commands and status (tests/unit/controller/core/test_power_period_replay.py).
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Iterator
from typing import IO, Any

from rasd.controller.core.power import inputs as period_inputs
from rasd.controller.core.power import period, snapshot


class PeriodRecorder:
    """Writes every period it is handed to `path` (gzip JSON lines); `close()` when done."""

    def __init__(self, path: pathlib.Path) -> None:
        """Open `path` for writing (replacing it)."""
        # Open across calls (one line a period), closed by `close()`: no `with` can span them.
        self._file: IO[str] = gzip.open(path, "wt", encoding="utf-8")  # noqa: SIM115
        self.periods = 0

    def __call__(
        self, state: period.PeriodState, inputs: period_inputs.PeriodInputs, now_s: float, result: period.Period
    ) -> None:
        """Record one period (the `PowerLoop.on_step` signature)."""
        record = {"now_s": now_s, "state": state, "inputs": inputs, "result": result}
        self._file.write(json.dumps(snapshot.to_plain(record)["mapping"], allow_nan=False) + "\n")
        self.periods += 1

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()


def read(path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """The records of a file `PeriodRecorder` wrote: {"now_s", "state", "inputs", "result"} as values."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield {key: snapshot.from_plain(value) for key, value in json.loads(line).items()}
