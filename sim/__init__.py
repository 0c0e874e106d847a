"""rasd.sim: the whole system on loopback: a real controller plus N agents with simulated GPUs.

It is the one composition root allowed to import both the agent and the controller.
"""
