"""wait_event: a bounded wait on an asyncio.Event that never swallows a cancel."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rasd.common import aio


def test_it_answers_whether_the_event_was_set_within_the_timeout():
    async def run() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        timed_out = await aio.wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        fired = await aio.wait_event(event, 5.0)
        already = await aio.wait_event(event, 0.0)
        return timed_out, fired, already

    assert asyncio.run(run()) == (False, True, True)


@pytest.mark.parametrize("attempt", range(200))
def test_a_cancel_that_lands_as_the_event_fires_ends_the_loop(attempt):
    """The race of gh-86296: event set and task cancelled in the same loop iteration, 200 times."""

    async def run() -> int:
        event = asyncio.Event()
        rounds = 0

        async def loop_forever() -> None:
            nonlocal rounds
            while True:
                await aio.wait_event(event, 10.0)
                event.clear()
                rounds += 1

        task = asyncio.create_task(loop_forever())
        for _ in range(attempt % 3):
            await asyncio.sleep(0)
        event.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=2.0)
        return rounds

    assert asyncio.run(run()) <= 1
