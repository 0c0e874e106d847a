"""The PostgreSQL write probe (issue #37 item 17): a store that connects but refuses writes is an outage.

Against the real test PostgreSQL: a server that is read-only for the store's sessions
(`default_transaction_read_only`, as after a failover onto a standby) and a role that lost its
privileges on the store's tables. Both used to fail ingest's writes with the server's error
(InternalError, ProgrammingError: not a store outage) while nothing probed or reported them.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from rasd.controller.store import repo, write_probe


@pytest.fixture
def migrated_url(postgres_schema_url):
    """A fresh schema migrated to head (the probe writes alembic_version)."""
    repo.Store.open(postgres_schema_url).close()
    return postgres_schema_url


def _write(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE nodes SET hostname = hostname")


def test_a_read_only_server_fails_the_probe_and_every_write_is_a_store_outage(migrated_url, postgres_url_with):
    engine = repo.create_engine(postgres_url_with(migrated_url, default_transaction_read_only="on"))
    try:
        with pytest.raises(repo.STORE_UNAVAILABLE, match="read-only transaction"):
            _write(engine)  # before any probe: the server's refusal is an outage, not an internal error
        problem = repo.probe_writes(engine)
        assert problem is not None and "read-only" in problem and "25006" in problem
        with pytest.raises(write_probe.StoreUnwritable, match="read-only"), engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")  # the gate: no transaction starts while the probe fails
    finally:
        engine.dispose()


def test_lost_privileges_fail_the_probe_and_it_recovers_when_they_are_back(migrated_url):
    engine = repo.create_engine(migrated_url)
    admin = sa.create_engine(migrated_url, poolclass=sa.pool.NullPool)
    try:
        assert repo.probe_writes(engine) is None
        with admin.begin() as connection:  # the owner revokes its own privilege, in this test's schema only
            connection.exec_driver_sql("REVOKE UPDATE ON alembic_version FROM CURRENT_USER")
        problem = repo.probe_writes(engine)
        assert problem is not None and "insufficient privilege" in problem
        with pytest.raises(repo.STORE_UNAVAILABLE):
            _write(engine)
        with admin.begin() as connection:
            connection.exec_driver_sql("GRANT UPDATE ON alembic_version TO CURRENT_USER")
        assert repo.probe_writes(engine) is None
        _write(engine)  # the gate is open again
    finally:
        engine.dispose()
        admin.dispose()


def test_a_probe_that_waits_on_a_lock_past_its_timeout_fails(migrated_url):
    engine = repo.create_engine(migrated_url)
    probe = repo.write_probe_of(engine)
    assert probe is not None
    probe.timeout_s = 0.2
    holder = sa.create_engine(migrated_url, poolclass=sa.pool.NullPool)
    try:
        with holder.begin() as connection:
            connection.exec_driver_sql("LOCK TABLE alembic_version IN EXCLUSIVE MODE")
            problem = repo.probe_writes(engine)
        assert problem is not None and "statement timeout" in problem
        assert repo.probe_writes(engine) is None
    finally:
        engine.dispose()
        holder.dispose()


def test_an_error_that_is_not_a_refused_write_stays_what_it_is():
    assert write_probe.unwritable_problem(ValueError("no sqlstate")) is None

    class _UniqueViolation(Exception):
        sqlstate = "23505"

    assert write_probe.unwritable_problem(_UniqueViolation("duplicate key")) is None


def test_sqlite_has_no_write_probe(tmp_path):
    engine = repo.create_engine(f"sqlite:///{tmp_path / 'rasd.db'}")
    assert repo.write_probe_of(engine) is None and repo.probe_writes(engine) is None


def test_an_unreachable_server_fails_the_probe_but_does_not_shut_the_gate(free_port):
    """Its transactions fail by themselves; a shut gate would only delay them once the server is back."""
    engine = repo.create_engine(f"postgresql+psycopg://rasd:rasd@127.0.0.1:{free_port}/rasd?connect_timeout=2")
    try:
        problem = repo.probe_writes(engine)
        assert problem is not None and problem.startswith("store write probe failed")
        probe = repo.write_probe_of(engine)
        assert probe is not None
        probe.check()  # does not raise
    finally:
        engine.dispose()
