"""rasd.controller.core.power: pure power decisions (tree, allocation, two-phase apply, ramp, swing)."""
