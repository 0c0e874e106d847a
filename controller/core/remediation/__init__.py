"""rasd.controller.core.remediation: pure repair decisions (classify, correlate, escalate, blast radius, SDC)."""
