"""A loopback TCP proxy that delays what the controller sends to the agents: delivery jitter on demand.

Owns one thing: a network between the agents and the controller whose downlink (controller to
agent: commands, acks) is late by a random, seeded amount per chunk, in order, as a congested
network or a busy controller makes it. A chunk read at t leaves at max(t + U(lo, hi), when the
previous one left): a late command holds back the next one, which then arrives right behind it, so
two periods' commands can land within a fraction of a period (what the job-start ramp must
survive). The uplink (telemetry, results) passes at once.

For `rasd-sim` (SimSettings.downlink_delay_s) and the tests; not for production.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

_CHUNK = 65536


class DelayProxy:
    """Listens on 127.0.0.1:0 and forwards every connection to `upstream` ("host:port")."""

    def __init__(self, upstream: str, delay_s: tuple[float, float], seed: int) -> None:
        """Delay each downlink chunk by U(delay_s[0], delay_s[1]) seconds, in order."""
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._delay_s = delay_s
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self) -> str:
        """Start listening; returns the address the agents connect to."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, agent_reader: asyncio.StreamReader, agent_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            agent_writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(agent_reader, up_writer, delayed=False)),
            asyncio.create_task(self._pump(up_reader, agent_writer, delayed=True)),
        ]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for writer in (up_writer, agent_writer):
            writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, delayed: bool) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer)) if delayed else None
        last_release = 0.0
        try:
            while data := await reader.read(_CHUNK):
                if sender is None:
                    writer.write(data)
                    await writer.drain()
                    continue
                last_release = max(last_release, loop.time() + self._rng.uniform(*self._delay_s))
                queue.put_nowait((last_release, data))
        finally:
            if sender is not None:
                sender.cancel()

    @staticmethod
    async def _send(queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            release, data = await queue.get()
            await asyncio.sleep(max(0.0, release - loop.time()))
            writer.write(data)
            await writer.drain()
