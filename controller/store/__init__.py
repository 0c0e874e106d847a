"""rasd.controller.store: the SQLAlchemy store (SQLite by default, PostgreSQL in production)."""
