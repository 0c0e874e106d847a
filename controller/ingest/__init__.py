"""rasd.controller.ingest: agent sessions, telemetry and durable events of this replica."""
