"""Alembic environment of the controller's store.

There is no alembic.ini: rasd.controller.store.migrate builds the Alembic Config in code and hands
this script either the caller's open connection (`config.attributes["connection"]`, which is how
`Store` upgrades at start-up, inside the caller's transaction) or a URL (`config.attributes["url"]`)
for the command line and for offline SQL (`--sql`).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from rasd.controller.store import migrate, schema


def _options(dialect_name: str) -> dict[str, object]:
    return {
        "target_metadata": schema.Base.metadata,
        # SQLite cannot ALTER most things: batch mode copies the table. Other backends ALTER in place.
        "render_as_batch": dialect_name == "sqlite",
        "compare_type": True,
    }


def _run_online(connection: sa.Connection) -> None:
    context.configure(connection=connection, **_options(connection.dialect.name))
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Replicas starting together upgrade one after the other; the later ones find head.
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": migrate.MIGRATION_LOCK_KEY})
        context.run_migrations()


def _run_offline(url: str) -> None:
    dialect_name = sa.engine.make_url(url).get_backend_name()
    context.configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"}, **_options(dialect_name))
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    attributes = context.config.attributes
    if context.is_offline_mode():
        _run_offline(attributes["url"])
        return
    connection = attributes.get("connection")
    if connection is not None:
        _run_online(connection)
        return
    engine = sa.create_engine(attributes["url"], poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as opened:
            _run_online(opened)
    finally:
        engine.dispose()


_main()
