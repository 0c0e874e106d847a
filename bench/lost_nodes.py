"""The lost-node watch: what a check costs the leader at fleet size, and how soon a dead node is quarantined.

Run: `RASD_TEST_POSTGRES_URL=postgresql+psycopg://rasd:rasd@127.0.0.1:5432/rasd_test .venv/bin/python
bench/lost_nodes.py` (`--nodes 12500 --trials 2`; `--no-write` leaves bench/RESULTS.md alone).

Two parts, each on a fresh schema of the PostgreSQL:

1. **Cost at fleet size.** `--nodes` node rows as the replicas leave them (each with its last-seen
   time), a real `RemediationService` (default policy) on a controller clock the bench moves. A
   minute later every node was heard from but 3: one check names those 3 and hands each to the
   ladder (quarantine, notice); then checks that find nothing new (the steady cost, every 10 s); then
   1,000 nodes fall silent at once: a storm, nothing named. Wall time of `LostNodeWatch.check_once`:
   the read beside the store thread, the judgement, the hand-overs.
2. **Dead node to quarantine, end to end.** The chart's default: two controller replicas on the
   PostgreSQL, `--trials` + 4 real agents (8 simulated GPUs each, default link rates), half streaming
   to each replica,
   the default `[remediation.lost_nodes]` but `lost_after_s` at its lowest, 20 s (the default is 60),
   so each trial takes half a minute. In each trial one agent stops (its host died: the stream ends,
   nothing more is sent), alternately on the follower and on the leader; the figure is the time from
   its stop to the leader's quarantine of its node; then an operator releases it (force), so that the
   disruption budget (one node out of service at once in so small a fleet) admits the next trial's.
   The bound is `lost_after_s` + `check_interval_s` + the replicas' last-seen flush (5 s). Live nodes
   quarantined meanwhile: must be none.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import replicas as replicas_bench
import results
from prometheus_client import CollectorRegistry

from rasd.agent import node_ops, runtime, spool
from rasd.agent import settings as agent_settings
from rasd.agent.gpu import simulated
from rasd.controller import server, wiring
from rasd.controller.core.remediation import policy as policy_mod
from rasd.controller.observability import metrics
from rasd.controller.replication import leader
from rasd.controller.store import repo, schema

SECTION = "## Lost nodes"
S = 10**9
E2E_LOST_AFTER_S = policy_mod.MIN_LOST_AFTER_S
GOAL_CHECK_MS = 100.0
FLUSH_S = 5.0


@dataclasses.dataclass
class Cost:
    """Part 1's figures: what the checks named and their wall times."""

    first_named: tuple[str, ...]
    first_ms: float
    steady_ms: list[float]
    storm_named: tuple[str, ...]
    storm_ms: float
    quarantined: int


def _cost(url: str, nodes: int) -> Cost:
    """Part 1: checks at fleet size on a controller clock (see the module docstring)."""
    store = repo.Store.open(url)
    now = {"ns": time.time_ns()}
    t0 = now["ns"]
    with store.engine.begin() as connection:
        connection.execute(
            schema.NodeRow.__table__.insert(),
            [
                {"node_id": f"node-{i:05d}", "labels": {"rack": f"rack-{i // 16:04d}"}, "state": 1,
                 "connected": True, "first_seen_unix_ns": t0, "last_seen_unix_ns": t0}
                for i in range(nodes)
            ],
        )  # fmt: skip
    wired = wiring.single_replica(
        store, metrics.ControllerMetrics(CollectorRegistry()), ladder=wiring.Ladder(), clock=lambda: now["ns"]
    )
    service = wired.remediation
    assert service is not None
    names = [f"node-{i:05d}" for i in range(nodes)]
    heard = [name for i, name in enumerate(names) if i not in (0, 100, 200)]  # 3 dead, in three racks

    async def scenario() -> Cost:
        await service.start()
        watch = service.lost_nodes
        try:
            now["ns"] = t0 + 61 * S
            store.touch_nodes(dict.fromkeys(heard, now["ns"]))
            started = time.perf_counter()
            first = await watch.check_once()
            first_ms = (time.perf_counter() - started) * 1e3
            steady = []
            for _ in range(10):
                now["ns"] += 10 * S
                store.touch_nodes(dict.fromkeys(heard, now["ns"]))
                started = time.perf_counter()
                await watch.check_once()
                steady.append((time.perf_counter() - started) * 1e3)
            now["ns"] += 70 * S  # 1,000 nodes silent since the last touch: their replicas are cut off
            store.touch_nodes(dict.fromkeys(heard[1000:], now["ns"]))
            started = time.perf_counter()
            storm = await watch.check_once()
            storm_ms = (time.perf_counter() - started) * 1e3
            return Cost(first, first_ms, steady, storm, storm_ms, len(service.store.quarantines()))
        finally:
            await service.stop()

    try:
        return asyncio.run(scenario())
    finally:
        store.close()


def _replica(url: str, name: str) -> server.Controller:
    lost = policy_mod.LostNodePolicy(lost_after_s=E2E_LOST_AFTER_S)
    return server.Controller(
        server.ControllerSettings(
            listen="127.0.0.1:0",
            db_url=url,
            metrics_port=None,
            leader=leader.LeaderSettings(replica_id=f"ctl-{name}"),
            remediation_policy=policy_mod.RemediationPolicy(lost_nodes=lost),
        )
    )


def _agent(node_id: str, address: str, directory: str) -> runtime.Agent:
    backend = simulated.SimulatedBackend(node_id, 8, 0, workload=simulated.StepWorkload())
    return runtime.Agent(
        agent_settings.AgentSettings(node_id=node_id, link=agent_settings.LinkSettings(controller_address=address)),
        backend,
        spool.Spool(os.path.join(directory, f"{node_id}.db")),
        boot_id="boot-1",
        ops=node_ops.SimulatedNodeOps(backend),
    )


def _end_to_end(url: str, trials: int) -> tuple[list[tuple[str, float]], list[str]]:
    """Part 2: per trial, where the stopped agent streamed and seconds from its stop to its quarantine; live held."""

    async def scenario() -> tuple[list[tuple[str, float]], list[str]]:
        one, other = _replica(url, "a"), _replica(url, "b")
        await one.start()
        await other.start()
        while not (one.leadership.is_leader() or other.leadership.is_leader()):
            await asyncio.sleep(0.1)
        first, second = (one, other) if one.leadership.is_leader() else (other, one)
        ladder = first.remediation
        assert ladder is not None
        with tempfile.TemporaryDirectory() as directory:
            homes = {f"node-{i}": (second if i % 2 == 0 else first) for i in range(trials + 4)}
            agents = {node: _agent(node, home.address, directory) for node, home in homes.items()}
            stops = {node: asyncio.Event() for node in agents}
            tasks = {node: asyncio.create_task(agent.run(stops[node])) for node, agent in agents.items()}
            figures: list[tuple[str, float]] = []
            try:
                while any(node not in home.ingest.sessions for node, home in homes.items()):
                    await asyncio.sleep(0.1)
                await asyncio.sleep(FLUSH_S + 1)
                for trial in range(trials):
                    node = f"node-{trial}"
                    stops[node].set()
                    await tasks.pop(node)
                    stopped = time.monotonic()
                    while not any(q["node_id"] == node for q in ladder.store.quarantines()):
                        await asyncio.sleep(0.1)
                        if time.monotonic() - stopped > 5 * E2E_LOST_AFTER_S:
                            raise TimeoutError(f"{node} was not quarantined within {5 * E2E_LOST_AFTER_S:.0f} s")
                    where = "follower" if homes[node] is second else "leader"
                    figures.append((where, time.monotonic() - stopped))
                    # A person releases it, as after a repair: the disruption budget (one node out of
                    # service at once at this fleet's size) then admits the next trial's quarantine.
                    await ladder.operator_release(node, "", reason="bench: next trial", force=True, actor="bench")
                held = sorted({q["node_id"] for q in ladder.store.quarantines()})
                return figures, held
            finally:
                for node, task in tasks.items():
                    stops[node].set()
                    await task
                await other.stop()
                await one.stop()

    return asyncio.run(scenario())


def _section(cost: Cost, nodes: int, e2e: list[tuple[str, float]], held: list[str], command: str) -> tuple[str, bool]:
    """The RESULTS.md section and whether both goals were met."""
    pol = policy_mod.LostNodePolicy()
    bound_s = E2E_LOST_AFTER_S + pol.check_interval_s + FLUSH_S
    default_bound_s = pol.lost_after_s + pol.check_interval_s + FLUSH_S
    steady_p50, steady_max = statistics.median(cost.steady_ms), max(cost.steady_ms)
    worst_check = max(cost.first_ms, steady_max, cost.storm_ms)
    cost_ok = worst_check <= GOAL_CHECK_MS and len(cost.first_named) == 3 and not cost.storm_named
    e2e_ok = bool(e2e) and all(seconds <= bound_s for _where, seconds in e2e) and not held
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        SECTION,
        "",
        f"Command: `{command}`  ",
        f"Machine: {results.machine()}  ",
        f"Run: {when}; each part on a fresh schema of the PostgreSQL (setup: bench/lost_nodes.py's docstring).",
        "",
        f"Cost of a check at {nodes:,} nodes (the leader's `LostNodeWatch.check_once`: one read of every node's",
        "last-seen time beside the store thread, the judgement, the hand-overs to the ladder):",
        "",
        "| check | named lost | wall ms |",
        "|---|---:|---:|",
        f"| 3 of {nodes:,} silent for 61 s | {len(cost.first_named)} | {cost.first_ms:.1f} |",
        f"| nothing new (10 checks) | 0 | p50 {steady_p50:.1f}, max {steady_max:.1f} |",
        f"| 1,000 silent at once (storm) | {len(cost.storm_named)} | {cost.storm_ms:.1f} |",
        "",
        f"Quarantines the ladder made: {cost.quarantined} (the lost nodes'; none for the storm).",
        "",
        f"Dead node to quarantine, end to end (two replicas, {len(e2e) + 4} agents split between them, default",
        f"link rates, `lost_after_s` {E2E_LOST_AFTER_S:.0f} s, checks every {pol.check_interval_s:.0f} s; the bound is",
        f"{E2E_LOST_AFTER_S:.0f} + {pol.check_interval_s:.0f} + {FLUSH_S:.0f} s = {bound_s:.0f} s):",
        "",
        "| trial | its stream was on | stop → quarantined s |",
        "|---:|---|---:|",
        *(f"| {i + 1} | {where} | {seconds:.1f} |" for i, (where, seconds) in enumerate(e2e)),
        "",
        f"Live nodes quarantined: {len(held)}{' (' + ', '.join(held) + ')' if held else ''}. At the default",
        f"`lost_after_s` of {pol.lost_after_s:.0f} s a dead node is quarantined within {default_bound_s:.0f} s",
        "(rasd-sim goodput counts 70 s).",
        "",
        f"Goal: a check at {nodes:,} nodes ≤ {GOAL_CHECK_MS:.0f} ms (worst {worst_check:.1f} ms), the lost nodes "
        f"named and the storm's none: {'met' if cost_ok else 'NOT met'}",
        f"Goal: every dead node quarantined within lost_after_s + check_interval_s + the flush ({bound_s:.0f} s), "
        f"no live node quarantined: {'met' if e2e_ok else 'NOT met'}",
    ]
    return "\n".join(lines) + "\n", cost_ok and e2e_ok


def main(argv: list[str] | None = None) -> int:
    """Run both parts; print the section and write it to bench/RESULTS.md unless --no-write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    url = os.environ.get(replicas_bench.POSTGRES_URL_ENV)
    if not url:
        print(f"set {replicas_bench.POSTGRES_URL_ENV} to a PostgreSQL URL (.ci/postgres.sh makes one)", file=sys.stderr)
        return 2
    with replicas_bench.schema(url) as fresh:
        cost = _cost(fresh, args.nodes)
    with replicas_bench.schema(url) as fresh:
        e2e, held = _end_to_end(fresh, args.trials)
    command = f"{replicas_bench.POSTGRES_URL_ENV}=... .venv/bin/python bench/lost_nodes.py"
    command += f" --nodes {args.nodes} --trials {args.trials}"
    text, met = _section(cost, args.nodes, e2e, held, command)
    print(text)
    if not args.no_write:
        results.write_section(SECTION, text)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
