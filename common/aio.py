"""asyncio helpers shared by the daemons' loops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

CommandT = TypeVar("CommandT")
ResultT = TypeVar("ResultT")


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until event is set or timeout_s passes; True when it is set.

    Use this, not ``asyncio.wait_for(event.wait(), timeout)``, in a loop that ends by being cancelled:
    Python 3.11's wait_for can swallow a cancel that lands as the event fires (gh-86296), and the
    loop then runs on for ever, so whoever awaits its task on shutdown hangs (seen: a controller whose
    relay intake loop never stopped). ``asyncio.wait`` always lets the cancel through.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _pending = await asyncio.wait({waiter}, timeout=max(0.0, timeout_s))
    finally:
        waiter.cancel()
    return bool(done)


async def send_each(
    send: Callable[..., Awaitable[ResultT]],
    commands: Iterable[tuple[int, str, CommandT]],
    *,
    timeout_s: float,
    on_result: Callable[[int, ResultT | BaseException], Any],
) -> None:
    """``send(node_id, command, timeout_s=…)`` for each (index, node_id, command), all at once.

    Each outcome goes to on_result(index, result or the exception send raised) as it comes; returns
    when every one has. For a batch sent over streams that take one command at a time.
    """

    async def one(index: int, node_id: str, command: CommandT) -> None:
        try:
            result = await send(node_id, command, timeout_s=timeout_s)
        except Exception as exc:
            on_result(index, exc)
        else:
            on_result(index, result)

    await asyncio.gather(*(one(index, node_id, command) for index, node_id, command in commands))
