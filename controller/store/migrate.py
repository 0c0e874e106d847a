"""Alembic migrations of the controller's store, driven from code: there is no alembic.ini.

`Store` calls `upgrade(engine)` when it opens a database: an empty one gets every table, one at head
is left alone, an older one is upgraded. Developers use the command line (see
controller/store/migrations/README.md)::

    python -m rasd.controller.store.migrate revision -m "add foo"   # autogenerate the next revision
    python -m rasd.controller.store.migrate check                   # schema.py and migrations agree?
    python -m rasd.controller.store.migrate upgrade --db URL [--sql]
    python -m rasd.controller.store.migrate current --db URL
    python -m rasd.controller.store.migrate history
"""

from __future__ import annotations

import argparse
import importlib.resources
import pathlib
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from rasd.controller.store import schema

VERSION_TABLE = "alembic_version"
# Key of the PostgreSQL advisory lock env.py holds (to the end of the transaction) while migrating, so
# that controller replicas starting at the same time upgrade one after the other.
MIGRATION_LOCK_KEY = 0x72617364  # "rasd"
# Alembic keeps the running migration in module globals (alembic.context, alembic.op): one at a time
# per process, even if two threads open stores at once.
_ALEMBIC = threading.RLock()


def script_location() -> str:
    """The packaged migrations folder (env.py, script.py.mako, versions/)."""
    return str(importlib.resources.files("rasd.controller.store.migrations"))


def alembic_config(
    *, connection: sa.Connection | None = None, url: str | None = None, script_dir: str | None = None
) -> Config:
    """An Alembic Config built in code, for a connection (online) or a URL (offline SQL, or env.py opens it).

    Args:
        connection: run migrations inside this connection and its transaction.
        url: the database URL, when there is no connection.
        script_dir: another migrations folder (tests); defaults to the packaged one.
    """
    config = Config()
    config.set_main_option("script_location", script_dir or script_location())
    config.set_main_option("path_separator", "os")
    # versions/0002_add_foo.py: revision ids are sequence numbers (see `next_revision_id`).
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    config.set_main_option("truncate_slug_length", "48")
    if connection is not None:
        config.attributes["connection"] = connection
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision(script_dir: str | None = None) -> str:
    """The revision the code expects the database to be at."""
    head = ScriptDirectory.from_config(alembic_config(script_dir=script_dir)).get_current_head()
    if head is None:
        raise RuntimeError("the store has no migrations")
    return head


def current_revision(connection: sa.Connection) -> str | None:
    """The revision the database is at (None: never migrated)."""
    return MigrationContext.configure(connection).get_current_revision()


def differences(connection: sa.Connection, metadata: sa.MetaData | None = None) -> list[Any]:
    """What autogenerate finds between the database and schema.py; [] when they agree."""
    context = MigrationContext.configure(
        connection, opts={"compare_type": True, "render_as_batch": connection.dialect.name == "sqlite"}
    )
    return list(compare_metadata(context, metadata if metadata is not None else schema.Base.metadata))


def upgrade(engine: sa.Engine, revision: str = "head", *, script_dir: str | None = None) -> None:
    """Bring the database to revision in one transaction (PostgreSQL: one replica at a time).

    A database created before there were migrations (tables but no alembic_version) is adopted:
    missing tables are created and it is stamped at head, but only if it then matches schema.py.

    Args:
        engine: the store's engine.
        revision: the target; head unless testing.
        script_dir: another migrations folder (tests); defaults to the packaged one.
    """
    with _ALEMBIC, engine.connect() as connection, _migration_transaction(connection):
        _adopt_unversioned(connection, script_dir)
        command.upgrade(alembic_config(connection=connection, script_dir=script_dir), revision)


@contextmanager
def _migration_transaction(connection: sa.Connection) -> Iterator[None]:
    """One transaction around a whole migration, DDL included; rolled back entirely on failure.

    PostgreSQL: a plain transaction (DDL is transactional) holding the migration advisory lock.
    SQLite: pysqlite opens transactions only before DML, so CREATE TABLEs would commit one by one and
    a failed upgrade would leave half a schema. Here the driver's implicit transactions are switched
    off and the migration runs inside BEGIN IMMEDIATE, which also takes the write lock, so two
    processes upgrading one file take turns.
    Foreign keys are off while migrating (batch mode re-creates tables, and dropping a referenced
    table would fail or cascade) and checked before committing.
    """
    if connection.dialect.name != "sqlite":
        with connection.begin():
            if connection.dialect.name == "postgresql":  # env.py takes it too; held here before adopting
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            yield
        return
    driver = connection.connection.driver_connection
    saved_isolation = driver.isolation_level
    driver.isolation_level = None
    try:
        driver.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: before BEGIN
        with connection.begin():
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            yield
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"the migration broke foreign keys: {broken[:5]}")
    finally:
        driver.execute("PRAGMA foreign_keys=ON")
        driver.isolation_level = saved_isolation


def _adopt_unversioned(connection: sa.Connection, script_dir: str | None = None) -> None:
    tables = set(sa.inspect(connection).get_table_names())
    if VERSION_TABLE in tables or not tables & set(schema.Base.metadata.tables):
        return
    schema.Base.metadata.create_all(connection)
    found = differences(connection)
    if found:
        raise RuntimeError(
            "the store was created before migrations existed and differs from this version's schema "
            f"({len(found)} differences, first {found[0]!r}); move the database aside or migrate it by hand"
        )
    command.stamp(alembic_config(connection=connection, script_dir=script_dir), "head")


def next_revision_id(script_dir: str | None = None) -> str:
    """Revision ids are zero-padded sequence numbers: 0001, 0002, ..."""
    scripts = ScriptDirectory.from_config(alembic_config(script_dir=script_dir))
    numbers = [int(script.revision) for script in scripts.walk_revisions() if script.revision.isdigit()]
    return f"{max(numbers, default=0) + 1:04d}"


@contextmanager
def _database(url: str | None, script_dir: str | None) -> Iterator[sa.Engine]:
    """The engine for url, or a throwaway SQLite database brought to head."""
    from rasd.controller.store import repo  # here: repo imports this module

    if url is not None:
        engine = repo.create_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()
        return
    with tempfile.TemporaryDirectory(prefix="rasd-migrate-") as tmp:
        engine = repo.create_engine(f"sqlite:///{pathlib.Path(tmp) / 'head.db'}")
        try:
            upgrade(engine, script_dir=script_dir)
            yield engine
        finally:
            engine.dispose()


def _ruff(path: str) -> None:
    """Lint-fix and format a generated revision; best effort (ruff is a dev dependency)."""
    for args in (["check", "--fix", "--quiet"], ["format", "--quiet"]):
        try:
            subprocess.run([sys.executable, "-m", "ruff", *args, path], check=False, capture_output=True)
        except OSError:
            return


def main(argv: Sequence[str] | None = None, *, script_dir: str | None = None) -> int:
    """The migrations command line; returns the exit status.

    Args:
        argv: arguments after the program name.
        script_dir: another migrations folder (tests); defaults to the packaged one.
    """
    parser = argparse.ArgumentParser(prog="python -m rasd.controller.store.migrate", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    revision = commands.add_parser("revision", help="write the next revision, autogenerated from schema.py")
    revision.add_argument("-m", "--message", required=True)
    revision.add_argument("--empty", action="store_true", help="do not autogenerate (data migrations)")
    revision.add_argument("--db", help="compare against this database at head (default: a fresh SQLite one)")
    check = commands.add_parser("check", help="exit 1 if schema.py has changes no migration makes")
    check.add_argument("--db", help="a database at head (default: a fresh SQLite one)")
    for name in ("upgrade", "downgrade"):
        sub = commands.add_parser(name, help=f"{name} a database")
        sub.add_argument("revision", nargs="?" if name == "upgrade" else None, default="head")
        sub.add_argument("--db", default="sqlite:///rasd.db", help="SQLAlchemy URL (default %(default)s)")
        sub.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    current = commands.add_parser("current", help="the revision a database is at")
    current.add_argument("--db", default="sqlite:///rasd.db", help="SQLAlchemy URL (default %(default)s)")
    commands.add_parser("history", help="list the revisions")
    args = parser.parse_args(argv)
    with _ALEMBIC:
        return _run(args, script_dir)


def _run(args: argparse.Namespace, script_dir: str | None) -> int:
    if args.command == "history":
        command.history(alembic_config(script_dir=script_dir))
        return 0
    if args.command in ("upgrade", "downgrade") and args.sql:
        getattr(command, args.command)(alembic_config(url=args.db, script_dir=script_dir), args.revision, sql=True)
        return 0
    if args.command == "revision" and args.empty:
        config = alembic_config(script_dir=script_dir)
        written = command.revision(config, args.message, rev_id=next_revision_id(script_dir))
        return _report_written(written)
    with _database(args.db, script_dir) as engine:
        if args.command == "upgrade":
            upgrade(engine, args.revision, script_dir=script_dir)
            return 0
        if args.command == "downgrade":
            with engine.connect() as connection, _migration_transaction(connection):
                command.downgrade(alembic_config(connection=connection, script_dir=script_dir), args.revision)
            return 0
        with engine.connect() as connection:
            if args.command == "current":
                print(current_revision(connection) or "(none: an empty or pre-migration database)")
                return 0
            found = differences(connection)
            if args.command == "check":
                for diff in found:
                    print(diff)
                if found:
                    print("schema.py differs from the migrations: add one with `migrate revision -m ...`")
                return 1 if found else 0
            # revision --autogenerate
            if not found:
                print("warning: no schema changes detected; the revision is empty", file=sys.stderr)
            config = alembic_config(connection=connection, script_dir=script_dir)
            written = command.revision(config, args.message, autogenerate=True, rev_id=next_revision_id(script_dir))
            return _report_written(written)


def _report_written(written: Any) -> int:
    for script in written if isinstance(written, list) else [written]:
        if script is not None:
            _ruff(script.path)
            print(f"wrote {script.path}: review it, then run the migration tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
