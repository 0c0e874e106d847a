"""rasd.controller.power: the power loop, timer and I/O around the pure power core."""
