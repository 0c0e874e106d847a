"""rasd.common: the few pieces every rasd program shares (logging set-up, version).

It imports none of the components (agent, controller, validation), so any of them may use it.
"""

VERSION = "0.1.0"
