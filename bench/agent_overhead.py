"""Agent CPU overhead per node: 8 GPUs at 10 Hz power and 1 Hz counters, streaming to a real controller.

Measured once with the simulated backend and once with the NVML backend over the pynvml test double
(the real pynvml.py against a fake libnvidia-ml). On a GPU node, `--backends nvml-real` measures the
NVML backend against the real driver (all the node's GPUs; --gpus is then ignored) and writes its own
section, "## Agent overhead on a real GPU", so the two machines' figures never overwrite each other.

Run: .venv/bin/python bench/agent_overhead.py [--duration-s 30] [--gpus 8] [--backends simulated,nvml-double]

Each agent runs alone in a child process so its CPU time (user + system, all threads) is its own;
the controller runs in a third process. Figures go to the "## Agent overhead" section of
bench/RESULTS.md. The goal from the agent issue: ≤ 1% of one core per node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time

import results

REPO = pathlib.Path(__file__).resolve().parent.parent
SECTION = "## Agent overhead"
REAL_GPU_SECTION = "## Agent overhead on a real GPU"
BACKENDS = ("simulated", "nvml-double", "nvml-real")
GOAL_PCT = 1.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _open_backend(name: str, gpus: int):  # type: ignore[no-untyped-def]
    if name == "simulated":
        from rasd.agent.gpu import simulated

        return simulated.SimulatedBackend("bench-node", gpus, 0, workload=simulated.StepWorkload())
    if name == "nvml-real":
        from rasd.agent.gpu import nvml

        return nvml.open_nvml_backend()
    sys.path.insert(0, str(REPO / "tests" / "nvml_double"))
    import fake_nvml

    from rasd.agent.gpu import nvml

    fake_nvml.install(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(i) for i in range(gpus)]))
    return nvml.open_nvml_backend()


async def _child(backend_name: str, controller: str, gpus: int, duration_s: float, warmup_s: float) -> dict:
    from rasd.agent import runtime, spool
    from rasd.agent import settings as agent_settings

    backend = _open_backend(backend_name, gpus)
    inventory = backend.inventory()
    agent = runtime.Agent(
        agent_settings.AgentSettings(
            node_id="bench-node", link=agent_settings.LinkSettings(controller_address=controller)
        ),
        backend,
        spool.Spool(":memory:"),
        boot_id="boot",
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await asyncio.sleep(warmup_s)
    cpu0, wall0, samples0, batches0 = (
        _cpu_s(),
        time.monotonic(),
        agent.stats.power_samples,
        agent.stats.telemetry_batches_sent,
    )
    await asyncio.sleep(duration_s)
    cpu1, wall1 = _cpu_s(), time.monotonic()
    samples = agent.stats.power_samples - samples0
    batches = agent.stats.telemetry_batches_sent - batches0
    stop.set()
    await task
    backend.close()
    return {
        "backend": backend_name,
        "gpus": len(inventory),
        "models": sorted({info.model for info in inventory}),
        "cpu_s": cpu1 - cpu0,
        "wall_s": wall1 - wall0,
        "power_samples": samples,
        "telemetry_batches": batches,
        "connected": agent.stats.connects > 0,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """Run both backends, print the table, update bench/RESULTS.md; exit 1 if the goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--backends",
        default="simulated,nvml-double",
        help=f"comma-separated, from {', '.join(BACKENDS)} (nvml-real needs a GPU node's driver)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        parser.error(f"--backends: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(BACKENDS)}")
    section = REAL_GPU_SECTION if "nvml-real" in backends else SECTION
    if args.child:
        report = asyncio.run(_child(args.child, args.controller, args.gpus, args.duration_s, args.warmup_s))
        print(json.dumps(report))
        return 0

    bin_dir = pathlib.Path(sys.executable).parent
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = results.machine()
    with tempfile.TemporaryDirectory() as tmp:
        address = f"127.0.0.1:{_free_port()}"
        controller = subprocess.Popen(
            [str(bin_dir / "rasd-controller"), "--insecure", "--listen", address, "--metrics-port", "-1",
             "--db", f"sqlite:///{tmp}/bench.db", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(2.0)
            rows = []
            for backend in backends:
                child = subprocess.run(
                    [sys.executable, __file__, "--child", backend, "--controller", address, "--gpus", str(args.gpus),
                     "--duration-s", str(args.duration_s), "--warmup-s", str(args.warmup_s)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        finally:
            controller.terminate()
            controller.wait(timeout=30)

    lines = [
        "| backend | GPUs | connected | CPU % of one core | power samples/s | telemetry batches/s "
        "| CPU ms per 100 ms tick |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for row in rows:
        pct = 100 * row["cpu_s"] / row["wall_s"]
        worst = max(worst, pct)
        ticks = row["wall_s"] * 10
        lines.append(
            f"| {row['backend']} | {row['gpus']} | {row['connected']} | {pct:.2f} | "
            f"{row['power_samples'] / row['wall_s']:.0f} | {row['telemetry_batches'] / row['wall_s']:.2f} | "
            f"{1000 * row['cpu_s'] / ticks:.3f} |"
        )
    met = "met" if worst <= GOAL_PCT else "NOT met"
    # The real GPUs' models, as the agent measured saw them (no second NVML session here).
    real_models = sorted({m for row in rows if row["backend"] == "nvml-real" for m in row["models"]})
    gpu_names = ", GPUs: " + ", ".join(real_models) if real_models else ""
    text = "\n".join(
        [
            section,
            "",
            f"Command: `.venv/bin/python bench/agent_overhead.py --duration-s {args.duration_s:g} "
            f"--gpus {args.gpus} --backends {','.join(backends)}`  ",
            f"Machine: {header}{gpu_names}  ",
            f"Run: {started}; each agent alone in its own process for {args.duration_s:g} s after "
            f"{args.warmup_s:g} s warm-up, streaming to a real controller in another process. CPU = user + system "
            "of the agent process, all threads. `nvml-double` is the NVML backend running the real pynvml.py "
            "against the test double's fake libnvidia-ml (no GPU), so it measures our code and pynvml, not the "
            "driver; `nvml-real` is the same backend against the real driver, on all the node's GPUs.",
            "",
            *lines,
            "",
            f"Goal: ≤ {GOAL_PCT:g}% of one core per node: {met} (worst {worst:.2f}%).",
            "",
        ]
    )
    print(text)
    if not args.no_write:
        results.write_section(section, text)
    return 0 if worst <= GOAL_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
