"""Alembic migrations of the controller's store (run by rasd.controller.store.migrate, not imported)."""
