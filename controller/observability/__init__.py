"""rasd.controller.observability: metrics, the audit writer and stream recording."""
