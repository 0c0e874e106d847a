"""Store fixtures: every test that takes `store_url` or `store` runs on SQLite and on a real PostgreSQL.

The PostgreSQL half uses `postgres_schema_url` (tests/conftest.py): RASD_TEST_POSTGRES_URL, skipped
with a message saying so when unset or unreachable, unless RASD_TEST_POSTGRES_REQUIRED=1 (CI).
"""

from __future__ import annotations

import pytest

from rasd.controller.store import repo


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path):
    """A URL of an empty database: a SQLite file, or a fresh schema in the test PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rasd.db'}"
    return request.getfixturevalue("postgres_schema_url")


@pytest.fixture
def store(store_url):
    """A Store on an empty database of each backend, migrated to head."""
    opened = repo.Store.open(store_url)
    yield opened
    opened.close()
