"""asyncio helpers shared by the daemons' loops."""

from __future__ import annotations

import asyncio


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
