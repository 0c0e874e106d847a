"""rasd wire contracts (generated; see proto/generate.py)."""
