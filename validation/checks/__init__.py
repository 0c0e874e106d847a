"""The checks V0-V6, one module each.

Each has a run() adapter that launches work and returns raw output, and a pure judge(raw, spec) that
turns raw output into a CheckResult.

Raw output is plain JSON-able data (lists, dicts, numbers, strings) so that a run recorded on a GPU
node can be replayed through judge() in a unit test on any machine.
"""
