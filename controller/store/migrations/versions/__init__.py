"""Alembic revisions of the controller's store, one file each, applied in order by `Store`."""
