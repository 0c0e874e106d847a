"""Store calls that wait at the same time, made as one call on the store thread (a group commit).

After a controller restart every agent says Hello at once, and in a burst each agent's stream brings
its own small batch of events: a transaction (and a sync of the disk) each kept the store thread
busy. Grouped, each caller still gets its own outcome, once the group's transaction returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

OutcomeT = TypeVar("OutcomeT")


class GroupCommit(Generic[OutcomeT]):
    """Like store calls that wait at the same time, made as one call on the store thread (a group commit).

    ``many`` takes the waiting calls' argument tuples, in arrival order, and returns one outcome for
    each (an exception instance: that call alone failed); ``one`` takes one call's arguments. When
    ``many`` itself raises, each call of the group is made alone with ``one``, so that one refused
    call fails only its own caller (a store that is down fails each of them alike).
    """

    def __init__(
        self,
        name: str,
        run_in_store: Callable[..., Awaitable[Any]],
        many: Callable[[list[tuple[Any, ...]]], Sequence[OutcomeT | BaseException]],
        one: Callable[..., OutcomeT],
        max_group: int,
    ) -> None:
        self._name = name
        self._run_in_store = run_in_store
        self._many = many
        self._one = one
        self._max_group = max_group
        self._inbox: list[tuple[tuple[Any, ...], asyncio.Future[OutcomeT]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, *args: Any) -> OutcomeT:
        """The outcome of ``one(*args)``, made together with every call waiting then."""
        future: asyncio.Future[OutcomeT] = asyncio.get_running_loop().create_future()
        self._inbox.append((args, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=self._name)
        return await future

    async def _drain(self) -> None:
        while self._inbox:
            group, self._inbox = self._inbox[: self._max_group], self._inbox[self._max_group :]
            try:
                outcomes = await self._run_in_store(self._many, [args for args, _future in group])
            except Exception as exc:
                if len(group) == 1:
                    _settle(group[0][1], exc)
                    continue
                for args, future in group:
                    try:
                        _settle(future, await self._run_in_store(self._one, *args))
                    except Exception as one_exc:
                        _settle(future, one_exc)
                continue
            except BaseException:  # cancelled (shutdown): nobody waits for ever
                for _args, future in [*group, *self._inbox]:
                    future.cancel()
                self._inbox = []
                raise
            for (_args, future), outcome in zip(group, outcomes, strict=True):
                _settle(future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """Give a waiting caller its result or exception, unless it stopped waiting (its stream ended)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
