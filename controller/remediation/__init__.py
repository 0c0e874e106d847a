"""rasd.controller.remediation: the I/O around the pure repair core (decide, dispatch, operator calls)."""
