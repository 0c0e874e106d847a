"""`--ingest-workers N`: which settings can run workers, and what each worker is given."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rasd.controller import main, server, workers
from rasd.controller.replication import leader as leader_mod

PG = "postgresql+psycopg://rasd:rasd@db:5432/rasd"


def _settings(**changes) -> server.ControllerSettings:
    base = server.ControllerSettings(listen="0.0.0.0:7443", db_url=PG, metrics_port=9464)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "count", "complaint"),
    [
        ({}, 0, "is not a number of processes"),
        ({"db_url": "sqlite:///rasd.db"}, 2, "SQLite keeps one process"),
        ({"leader": leader_mod.LeaderSettings(election="static")}, 2, "lease election"),
        ({"listen": "0.0.0.0:0"}, 2, "fixed --listen port"),
        ({"listen": "0.0.0.0:65535"}, 2, "are not ports"),
        ({"record_path": "/tmp/r.jsonl"}, 2, "cannot --record"),
    ],
)
def test_settings_that_cannot_run_workers_are_named(changes, count, complaint):
    assert complaint in workers.problem(_settings(**changes), count)


def test_postgresql_with_lease_election_runs_workers():
    assert workers.problem(_settings(), 4) is None
    assert workers.problem(_settings(db_url="sqlite:///rasd.db"), 1) is None  # one process: nothing to refuse


def test_each_worker_is_a_replica_of_its_own_on_the_shared_port():
    settings = _settings(leader=leader_mod.LeaderSettings(replica_id="rasd-0"))
    first, second = workers.worker_settings(settings, 0), workers.worker_settings(settings, 1)
    assert (first.leader.replica_id, second.leader.replica_id) == ("rasd-0-w0", "rasd-0-w1")
    assert first.listen == second.listen == "0.0.0.0:7443" and first.reuse_port and second.reuse_port
    assert (first.own_listen, second.own_listen) == ("0.0.0.0:7444", "0.0.0.0:7445")
    assert (first.metrics_port, second.metrics_port) == (9464, 9465)
    assert workers.worker_settings(_settings(metrics_port=None), 1).metrics_port is None
    assert workers.worker_settings(_settings(listen="[::1]:7443"), 1).own_listen == "[::1]:7445"


def test_a_worker_builds_its_settings_from_the_parents_command_line():
    argv = ["--insecure", "--listen", "127.0.0.1:7443", "--db", PG, "--ingest-workers", "2", "--metrics-port", "-1"]
    built = main.settings_from_argv(argv)
    assert (built.listen, built.db_url, built.metrics_port) == ("127.0.0.1:7443", PG, None)


def test_a_worker_stops_once_its_parent_is_gone(monkeypatch):
    monkeypatch.setattr(workers, "PARENT_CHECK_S", 0.01)

    async def scenario() -> bool:
        stop = asyncio.Event()
        await asyncio.wait_for(workers._watch_parent(-1, stop), timeout=5)  # not our parent: handed to another
        return stop.is_set()

    assert asyncio.run(scenario())


def test_a_controller_alone_does_not_share_its_port(tmp_path, free_port):
    """gRPC's default is SO_REUSEPORT on: a second controller on the port took half of the new connections."""

    async def scenario() -> None:
        first = server.Controller(_settings(listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'a.db'}",
                                            metrics_port=None))  # fmt: skip
        second = server.Controller(_settings(listen=f"127.0.0.1:{free_port}", db_url=f"sqlite:///{tmp_path / 'b.db'}",
                                             metrics_port=None))  # fmt: skip
        await first.start()
        try:
            with pytest.raises((OSError, RuntimeError)):
                await second.start()
        finally:
            await second.stop()
            await first.stop()

    asyncio.run(scenario())
