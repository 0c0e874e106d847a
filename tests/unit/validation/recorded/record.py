"""Re-record the raw outputs that test_judges.py replays through judge().

Run from the repository root with torch installed:

    .venv/bin/python tests/unit/validation/recorded/record.py

Each file holds {"check", "spec", "raw", "injections"}: the spec the run used, the raw output run()
returned on CPU (3 logical slots, seed 3) and where the fault injector put its fault, if any.
Recorded on a CPU, these prove the judge logic; GPU recordings can be added the same way.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from rasd.validation.checks import v1_known_answer, v2_bitwise, v3_abft, v4_hbm, v5_transfer, v6_collective
from rasd.validation.context import RunContext
from rasd.validation.faults import FaultInjector, FaultKind
from rasd.validation.runtime import Budget, devices_from, setup_determinism

HERE = Path(__file__).parent
SEED = 3

SPECS = {
    "V1": (v1_known_answer, v1_known_answer.Spec(shapes=((12, 10, 16), (7, 5, 300)), repeats=2)),
    "V2": (v2_bitwise, v2_bitwise.Spec(shapes=((8, 6, 16),), dtypes=("float32", "bfloat16"), repeats=2)),
    "V3": (v3_abft, v3_abft.Spec(n=32, sustained_s=10, pulsed_s=10, pulse_off_s=0, max_iterations=3)),
    "V4": (v4_hbm, v4_hbm.Spec(test_bytes=64 << 10, chunk_words=1 << 12, block_words=1 << 10)),
    "V5": (v5_transfer, v5_transfer.Spec(transfer_bytes=4 << 10)),
    "V6": (v6_collective, v6_collective.Spec(elements=96, timeout_s=30)),
}

CASES = [
    ("v1_healthy", "V1", None),
    ("v1_bitflip", "V1", FaultInjector(FaultKind.BITFLIP, gpu=2)),
    ("v1_bitflip_once", "V1", FaultInjector(FaultKind.BITFLIP, gpu=2, occurrences=1)),
    ("v2_healthy", "V2", None),
    ("v2_bitflip", "V2", FaultInjector(FaultKind.BITFLIP, gpu=1)),
    ("v2_drift", "V2", FaultInjector(FaultKind.DRIFT, gpu=2)),
    ("v3_healthy", "V3", None),
    ("v3_bitflip", "V3", FaultInjector(FaultKind.BITFLIP, gpu=0)),
    ("v3_lowbit", "V3", FaultInjector(FaultKind.BITFLIP, gpu=0, bit=3)),
    ("v4_healthy", "V4", None),
    ("v4_stuck", "V4", FaultInjector(FaultKind.STUCK_BIT, gpu=1)),
    ("v4_alias", "V4", FaultInjector(FaultKind.ALIAS, gpu=1)),
    ("v5_healthy", "V5", None),
    ("v5_bitflip", "V5", FaultInjector(FaultKind.BITFLIP, gpu=2)),
    ("v6_healthy", "V6", None),
    ("v6_bitflip", "V6", FaultInjector(FaultKind.BITFLIP, gpu=1)),
]


def main() -> int:
    setup_determinism(SEED)
    for name, check, injector in CASES:
        module, spec = SPECS[check]
        ctx = RunContext(
            devices=devices_from([0, 1, 2], "cpu"),
            seed=SEED,
            budget=Budget(60),
            injector=injector,
            sleep=lambda _s: None,
        )
        raw = module.run(spec, ctx)
        record = {
            "check": check,
            "spec": dataclasses.asdict(spec),
            "raw": raw,
            "injections": [dataclasses.asdict(i) for i in injector.log] if injector else [],
        }
        # Keep the files small: the judge only reads a handful of injections.
        record["injections"] = record["injections"][:4]
        (HERE / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(name, module.judge(raw, spec).verdict.value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
