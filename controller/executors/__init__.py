"""rasd.controller.executors: carry out effects outside the agent stream (quarantine, BMC)."""
