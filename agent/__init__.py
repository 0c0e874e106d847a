"""rasd.agent: the per-node daemon that reads GPUs and the kernel log and carries out commands."""
