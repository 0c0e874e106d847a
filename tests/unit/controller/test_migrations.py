"""Alembic migrations: the migrated schema is exactly schema.py, on SQLite and on PostgreSQL.

The comparison test is what keeps future schema edits honest: a table or column added to schema.py
without a migration makes it fail (see controller/store/migrations/README.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from rasd.controller.store import migrate, repo, schema


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def test_a_migrated_database_is_exactly_schema_py(store_url):
    store = repo.Store.open(store_url)
    try:
        with store.engine.connect() as connection:
            assert migrate.differences(connection) == []
            assert migrate.current_revision(connection) == migrate.head_revision()
        assert _tables(store.engine) == set(schema.Base.metadata.tables) | {"alembic_version"}
    finally:
        store.close()


def test_a_model_change_without_a_migration_is_caught(store_url):
    # What a developer who edits schema.py and forgets the migration would have.
    edited = sa.MetaData(naming_convention=schema.NAMING_CONVENTION)
    for table in schema.Base.metadata.sorted_tables:
        table.to_metadata(edited)
    sa.Table("widgets", edited, sa.Column("id", sa.Integer, primary_key=True))
    edited.tables["nodes"].append_column(sa.Column("rack", sa.String(64), nullable=True))
    edited.tables["gpus"].c.serial.type = sa.String(128)
    store = repo.Store.open(store_url)
    try:
        with store.engine.connect() as connection:
            found = migrate.differences(connection, edited)
    finally:
        store.close()
    flat = [d for diff in found for d in (diff if isinstance(diff, list) else [diff])]
    assert ("add_table", "widgets") in [(d[0], d[1].name) for d in flat if d[0] == "add_table"]
    assert ("add_column", "nodes", "rack") in [(d[0], d[2], d[3].name) for d in flat if d[0] == "add_column"]
    assert any(d[0] == "modify_type" and d[2:4] == ("gpus", "serial") for d in flat)


def test_constraint_names_are_the_same_on_every_backend(store_url):
    store = repo.Store.open(store_url)
    try:
        inspector = sa.inspect(store.engine)
        assert [fk["name"] for fk in inspector.get_foreign_keys("gpus")] == ["fk_gpus_node_id_nodes"]
        assert [u["name"] for u in inspector.get_unique_constraints("health_events")] == ["uq_health_event_node_seq"]
        indexes = inspector.get_indexes("health_events")  # PostgreSQL also lists the unique constraint's
        assert {i["name"] for i in indexes if not i.get("duplicates_constraint")} == {
            "ix_health_events_node_id",
            "ix_health_events_received_unix_ns",
        }
        if store.engine.dialect.name == "postgresql":  # SQLite does not keep primary key names
            assert inspector.get_pk_constraint("nodes")["name"] == "pk_nodes"
    finally:
        store.close()


def test_reopening_a_database_at_head_keeps_its_rows(store_url):
    first = repo.Store.open(store_url)
    first.register_hello(_hello(), 100)
    first.close()
    second = repo.Store.open(store_url)
    try:
        assert [n.node_id for n in second.list_nodes()] == ["node-1"]
        with second.engine.connect() as connection:
            assert migrate.current_revision(connection) == migrate.head_revision()
    finally:
        second.close()


def test_downgrade_to_base_and_upgrade_again(store_url):
    repo.Store.open(store_url).close()
    assert migrate.main(["downgrade", "base", "--db", store_url]) == 0
    engine = repo.create_engine(store_url)
    try:
        assert _tables(engine) == {"alembic_version"}
        migrate.upgrade(engine)
        with engine.connect() as connection:
            assert migrate.differences(connection) == []
    finally:
        engine.dispose()


def test_a_database_from_before_migrations_is_adopted(store_url):
    # What `create_all` made before there were migrations: only the ingest tables.
    engine = repo.create_engine(store_url)
    try:
        old = [schema.Base.metadata.tables[name] for name in ("nodes", "gpus", "health_events")]
        schema.Base.metadata.create_all(engine, tables=old)
        with engine.begin() as connection:
            connection.execute(sa.insert(old[0]).values(node_id="old-node", labels={}, state=1, connected=False))
    finally:
        engine.dispose()
    store = repo.Store.open(store_url)
    try:
        assert [n.node_id for n in store.list_nodes()] == ["old-node"]
        with store.engine.connect() as connection:
            assert migrate.current_revision(connection) == migrate.head_revision()
            assert migrate.differences(connection) == []
    finally:
        store.close()


def test_a_database_from_before_migrations_that_differs_is_refused(store_url):
    engine = repo.create_engine(store_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE nodes (node_id VARCHAR(253) PRIMARY KEY, colour VARCHAR(8))"))
        with pytest.raises(RuntimeError, match="created before migrations"):
            repo.Store(engine)
        assert "alembic_version" not in _tables(engine)
    finally:
        engine.dispose()


# The revision a developer would add next, on top of the packaged head (whatever its number today).
NEXT_REVISION = migrate.next_revision_id()


def _scripts_with(tmp_path, next_revision: str) -> str:
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    header = '"""Test revision."""\n\nimport sqlalchemy as sa\nfrom alembic import op\n\n'
    ids = f'revision = "{NEXT_REVISION}"\ndown_revision = "{migrate.head_revision()}"\n'
    ids += "branch_labels = None\ndepends_on = None\n\n"
    (scripts / "versions" / f"{NEXT_REVISION}_test.py").write_text(header + ids + textwrap.dedent(next_revision))
    return str(scripts)


def test_a_failed_upgrade_leaves_the_database_as_it_was(store_url, tmp_path):
    # SQLite included: its DDL would otherwise commit table by table and leave half a schema.
    scripts = _scripts_with(
        tmp_path,
        """
        def upgrade():
            op.create_table("partial", sa.Column("id", sa.Integer, primary_key=True))
            raise RuntimeError("boom")


        def downgrade():
            pass
        """,
    )
    engine = repo.create_engine(store_url)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            migrate.upgrade(engine, script_dir=scripts)
        assert _tables(engine) == set()  # not even 0001, which ran in the same transaction
        migrate.upgrade(engine)
        assert "nodes" in _tables(engine)
    finally:
        engine.dispose()


def test_a_batch_migration_of_a_referenced_table_keeps_every_row(store_url, tmp_path):
    # On SQLite, changing a column type re-creates `nodes`, which gpus and health_events reference.
    scripts = _scripts_with(
        tmp_path,
        """
        def upgrade():
            with op.batch_alter_table("nodes") as batch:
                batch.alter_column("hostname", existing_type=sa.String(253), type_=sa.String(512))
                batch.add_column(sa.Column("rack", sa.String(64), nullable=False, server_default=""))


        def downgrade():
            with op.batch_alter_table("nodes") as batch:
                batch.drop_column("rack")
                batch.alter_column("hostname", existing_type=sa.String(512), type_=sa.String(253))
        """,
    )
    store = repo.Store.open(store_url)
    try:
        store.register_hello(_hello(), 100)
        store.append_events("node-1", [repo.StoredEvent("node-1", 1, 1, 1, 1, 3, "", None, "m", "kmsg", {})])
        migrate.upgrade(store.engine, script_dir=scripts)
        with store.engine.connect() as connection:
            assert migrate.current_revision(connection) == NEXT_REVISION
            assert connection.scalar(sa.text("SELECT rack FROM nodes WHERE node_id = 'node-1'")) == ""
            if connection.dialect.name == "sqlite":
                assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        (node,) = store.list_nodes()
        assert [g.record.uuid for g in node.gpus] == [_hello().gpus[0].uuid]
        assert store.count_events() == 1
        # The foreign keys still hold after the copy.
        with pytest.raises(sa.exc.IntegrityError):
            _insert_orphan_gpu(store.engine)
    finally:
        store.close()


def _insert_orphan_gpu(engine: sa.Engine) -> None:
    gpus = schema.Base.metadata.tables["gpus"]
    values = {c.name: 0 for c in gpus.columns if isinstance(c.type, sa.Integer | sa.Float)}
    values |= {c.name: "" for c in gpus.columns if isinstance(c.type, sa.String)}
    values |= {"uuid": "GPU-orphan", "node_id": "ghost", "labels": {}, "power_smoothing_supported": False}
    with engine.begin() as connection:
        connection.execute(sa.insert(gpus).values(values))


def test_replicas_starting_together_migrate_one_after_the_other(store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL behaviour: an advisory lock serializes concurrent upgrades")
    # Two controller processes open the same empty database. Holding their migration lock until both
    # wait for it makes them race for real; without the lock the loser fails with "already exists".
    opener = "import sys; from rasd.controller.store import repo; repo.Store.open(sys.argv[1]).close()"
    holder_engine = sa.create_engine(store_url, poolclass=sa.pool.NullPool)
    try:
        with holder_engine.connect() as holder:
            holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": migrate.MIGRATION_LOCK_KEY})
            replicas = [
                subprocess.Popen([sys.executable, "-c", opener, store_url], stderr=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            try:
                deadline = time.monotonic() + 60
                while _migration_lock_waiters(holder) < 2:
                    assert all(r.poll() is None for r in replicas), "a replica exited before migrating"
                    assert time.monotonic() < deadline, "the replicas never reached the migration lock"
                    time.sleep(0.05)  # waiting for the database: both replicas queue on the lock
            finally:
                holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": migrate.MIGRATION_LOCK_KEY})
                holder.commit()
            outcomes = [(r.wait(timeout=60), r.stderr.read()) for r in replicas]
            for replica in replicas:
                replica.stderr.close()
    finally:
        holder_engine.dispose()
    assert outcomes == [(0, ""), (0, "")]
    engine = repo.create_engine(store_url)
    try:
        with engine.connect() as connection:
            assert migrate.current_revision(connection) == migrate.head_revision()
            assert migrate.differences(connection) == []
    finally:
        engine.dispose()


def _migration_lock_waiters(connection: sa.Connection) -> int:
    key = migrate.MIGRATION_LOCK_KEY
    return connection.scalar(
        sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = :hi AND objid = :lo AND objsubid = 1"
        ),
        {"hi": key >> 32, "lo": key & 0xFFFFFFFF},
    )


def test_stores_opened_from_threads_at_once_all_come_up(store_url):
    # Alembic keeps the running migration in module globals; migrate serializes it per process.
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def start():
        try:
            barrier.wait(timeout=10)
            repo.Store.open(store_url).close()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


def test_check_command_passes_on_the_packaged_migrations(capsys):
    assert migrate.main(["check"]) == 0
    assert capsys.readouterr().out == ""


def test_offline_sql_for_postgresql(capsys):
    assert migrate.main(["upgrade", "--sql", "--db", "postgresql+psycopg://rasd@db.example/rasd"]) == 0
    sql = capsys.readouterr().out
    assert "CREATE TABLE nodes" in sql and "CREATE TABLE health_events" in sql
    assert "BIGSERIAL" in sql and "INSERT INTO alembic_version (version_num) VALUES ('0001')" in sql


def test_revision_command_autogenerates_the_next_migration(tmp_path, monkeypatch, capsys):
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    # A developer adds a table to schema.py ...
    widgets = sa.Table(
        "widgets", schema.Base.metadata, sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text)
    )
    try:
        assert migrate.main(["check"], script_dir=str(scripts)) == 1
        assert "add_table" in capsys.readouterr().out
        # ... and generates the migration the README describes.
        assert migrate.main(["revision", "-m", "add widgets"], script_dir=str(scripts)) == 0
        written = scripts / "versions" / f"{NEXT_REVISION}_add_widgets.py"
        text = written.read_text()
        assert f'down_revision = "{migrate.head_revision()}"' in text and 'op.create_table(\n        "widgets"' in text
        assert 'op.drop_table("widgets")' in text
        assert migrate.main(["check"], script_dir=str(scripts)) == 0
        db = f"sqlite:///{tmp_path / 'rasd.db'}"
        assert migrate.main(["upgrade", "--db", db], script_dir=str(scripts)) == 0
        engine = repo.create_engine(db)
        try:
            assert "widgets" in _tables(engine)
        finally:
            engine.dispose()
    finally:
        schema.Base.metadata.remove(widgets)
    assert "widgets" not in schema.Base.metadata.tables


def _hello():
    from rasd.controller.core import fleet

    gpu = fleet.GpuRecord(
        "GPU-00000000-0000-4000-8000-00000000000a", "H100", "0:18:0.0", 200, 700, 700, node_id="node-1"
    )
    return fleet.NodeHello("node-1", "boot-1", "0.1.0", "node-1", "simulated", {}, (gpu,), 0)
