#!/usr/bin/env python
"""How many parameter servers a dist_sync job needs: measured bytes per update, then a table.

For each config it trains one update to get the real parameter shapes (from the checkpoint
that update saves), then runs a 1-worker, 1-server dist_sync job on 127.0.0.1 whose worker
pushes a gradient and pulls every parameter N times, without and with 2-bit gradient
compression, and reads the bytes the worker process sent and received (``/proc/self/io``,
ZeroMQ and TCP framing included). From those figures and MXNet's rule for placing arrays on
servers it computes, for W workers at a given network bandwidth and step time, the fewest
servers whose busiest one moves its share of every worker's push and pull within one step.

    scripts/sizing.py                        # print the table
    scripts/sizing.py --readme               # also rewrite the table in docs/scale.md
    scripts/sizing.py --bandwidth-gbit 25 --step-seconds 0.05
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_CONFIGS = ("configs/ptb_lstm.yaml", "configs/ptb_zaremba_medium.yaml")
WORKER_COUNTS = (8, 16, 64, 256)
BIGARRAY_BOUND = 1_000_000  # MXNET_KVSTORE_BIGARRAY_BOUND's default (elements)
COMPRESSION = {"type": "2bit", "threshold": 0.5}
README_START, README_END = "<!-- sizing:start -->", "<!-- sizing:end -->"


# --- what one update moves -------------------------------------------------------------------


def param_shapes(config: str, work: Path) -> dict[str, tuple[int, ...]]:
    """The trainable arrays of the config's model, from a checkpoint after one update."""
    name = Path(config).stem + "_sizing"
    command = [sys.executable, "-m", "mxtrain", "fit", config, "--name", name, "--force",
               "--set", f"experiment.runs_dir={work}", "--set", "fit.max_updates=1",
               "--set", "data.eval=null", "--progress", "plain"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{config}: one update failed:\n{done.stderr[-2000:]}")
    import mxnet as mx

    params = sorted((work / name).glob("checkpoints/*/params.nd"))
    if not params:
        raise SystemExit(f"{config}: the update saved no checkpoint in {work / name}")
    arrays = mx.nd.load(str(params[-1]))
    trainable = {k: v for k, v in arrays.items() if not k.startswith("aux:")}
    return {k.split(":", 1)[-1]: tuple(v.shape) for k, v in trainable.items()}


def measure(shapes: list[tuple[int, ...]], updates: int, compression: dict | None) -> dict:
    """Bytes the worker of a 1-worker, 1-server dist_sync job on 127.0.0.1 sends and receives
    per push+pull of ``shapes``."""
    from mxtrain.launch import JobSpec, ProcessSpec, free_port, role_env, run_job

    job = JobSpec(num_workers=1, num_servers=1, worker_args=[])
    port = free_port()
    code = (
        "import json, sys; from mxtrain.distributed import measure_push_pull_bytes as m; "
        "print('SIZING ' + json.dumps(m([tuple(s) for s in json.loads(sys.argv[1])], "
        "int(sys.argv[2]), json.loads(sys.argv[3]))))"
    )
    specs = [
        ProcessSpec(role, [sys.executable, "-c", "import mxtrain, mxnet"],
                    role_env(role, job, "127.0.0.1", port, "127.0.0.1"))
        for role in ("scheduler", "server")
    ]  # fmt: skip
    worker_argv = [sys.executable, "-c", code, json.dumps(shapes), str(updates),
                   json.dumps(compression)]  # fmt: skip
    env = role_env("worker", job, "127.0.0.1", port, "127.0.0.1")
    env["OMP_NUM_THREADS"] = "1"
    specs.append(ProcessSpec("worker", worker_argv, env))
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as logs:
        run_job(specs, Path(logs), grace=3.0, echo=lines.append)
    found = [line.split("SIZING ", 1)[1] for line in lines if "SIZING " in line]
    if not found:
        raise SystemExit("the measuring worker printed no figures:\n" + "\n".join(lines[-20:]))
    return json.loads(found[-1])


# --- where the bytes go ------------------------------------------------------------------------


def push_bytes(elements: int, compressed: bool) -> int:
    """Bytes of one array's gradient push: float32, or 2 bits per value with 2-bit compression
    (16 values per 4-byte word)."""
    return math.ceil(elements / 16) * 4 if compressed else elements * 4


def server_loads(sizes: list[int], servers: int, compressed: bool) -> list[tuple[int, int]]:
    """(push bytes in, pull bytes out) per server for one worker's update, placed as MXNet's
    dist kvstore does: an array of at least BIGARRAY_BOUND elements is split evenly over all
    servers, a smaller one goes whole to server (key * 9973) % servers (key: its index)."""
    loads = [[0, 0] for _ in range(servers)]
    for key, size in enumerate(sizes):
        if size >= BIGARRAY_BOUND:
            for i in range(servers):
                part = round(size / servers * (i + 1)) - round(size / servers * i)
                loads[i][0] += push_bytes(part, compressed)
                loads[i][1] += part * 4
        else:
            server = (key * 9973) % servers
            loads[server][0] += push_bytes(size, compressed)
            loads[server][1] += size * 4
    return [(push, pull) for push, pull in loads]


@dataclass
class Plan:
    workers: int
    servers: int | None  # None: no number of servers is enough (see reason)
    reason: str = ""


def servers_needed(
    sizes: list[int],
    workers: int,
    compressed: bool,
    bytes_per_second: float,
    step_seconds: float,
    overhead: tuple[float, float],
    max_servers: int = 1024,
) -> Plan:
    """The fewest servers whose busiest one receives ``workers`` pushes and sends ``workers``
    pulls of its share within ``step_seconds`` (full duplex: in and out at the same time);
    ``overhead`` scales push and pull bytes as measured against the bare float32 bytes."""
    own_push = sum(push_bytes(s, compressed) for s in sizes) * overhead[0]
    own_pull = sum(s * 4 for s in sizes) * overhead[1]
    if max(own_push, own_pull) / bytes_per_second > step_seconds:
        worst = max(own_push, own_pull) / bytes_per_second
        return Plan(workers, None, f"a worker's own link needs {worst:.2f} s per update")
    for servers in range(1, max_servers + 1):
        busiest = max(
            max(push * overhead[0], pull * overhead[1])
            for push, pull in server_loads(sizes, servers, compressed)
        )
        if workers * busiest / bytes_per_second <= step_seconds:
            return Plan(workers, servers)
    return Plan(workers, None, f"more than {max_servers}: one array is too big for one server")


# --- the report --------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def report(models: list[dict[str, Any]], bandwidth_gbit: float, step_seconds: float) -> str:
    rate = bandwidth_gbit * 1e9 / 8
    lines = [
        "| model | parameters | push / pull per worker per update, measured | with 2-bit "
        "compression | "
        + " | ".join(f"servers for {w} workers (2-bit)" for w in WORKER_COUNTS)
        + " |",
        "|---|---|---|---|" + "---|" * len(WORKER_COUNTS),
    ]
    for model in models:
        sizes = model["sizes"]
        plain, packed = model["plain"], model["compressed"]
        cells = []
        # measured bytes against the bare float32 (or 2-bit) payload: the framing overhead
        overheads = {
            compressed: (
                measured["sent_per_update"] / sum(push_bytes(s, compressed) for s in sizes),
                measured["received_per_update"] / sum(s * 4 for s in sizes),
            )
            for compressed, measured in ((False, plain), (True, packed))
        }
        for workers in WORKER_COUNTS:
            found = []
            for compressed, overhead in overheads.items():
                plan = servers_needed(sizes, workers, compressed, rate, step_seconds, overhead)
                found.append(str(plan.servers) if plan.servers else f"none ({plan.reason})")
            cells.append(f"{found[0]} ({found[1]})")
        mb = 1e6
        lines.append(
            f"| `{model['config']}` | {sum(sizes):,} | {plain['sent_per_update'] / mb:.1f} MB / "
            f"{plain['received_per_update'] / mb:.1f} MB | {packed['sent_per_update'] / mb:.2f} "
            f"MB / {packed['received_per_update'] / mb:.1f} MB | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        f"Assumptions: {bandwidth_gbit:g} Gbit/s per machine in each direction, every server "
        f"on a machine of its own, a step of {step_seconds:g} s that the transfers must fit in "
        "(no overlap with computation counted), dist_sync as mxtrain runs it (every worker "
        "pushes its gradient and pulls the summed gradient, as many bytes as the weights, "
        "each update), MXNet's placement (arrays of 1e6 "
        "elements or more split over all servers, smaller ones whole on one server by key). "
        "Bytes measured on 127.0.0.1 by the worker process (framing included) on "
        f"{cpu_name()}, MXNet 1.9.1; 2-bit compression shrinks only the push (the pull stays "
        "float32), so it halves what a worker moves but not what the busiest server sends: "
        "the pull sets the server count. Generated by `scripts/sizing.py`.",
    ]
    return "\n".join(lines) + "\n"


def write_readme(table: str) -> None:
    readme = ROOT / "docs" / "scale.md"
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"docs/scale.md has no {README_START} ... {README_END} section")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{table}{README_END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=list(DEFAULT_CONFIGS))
    parser.add_argument("--bandwidth-gbit", type=float, default=10.0)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--updates", type=int, default=10, help="measured push+pull rounds")
    parser.add_argument("--readme", action="store_true", help="rewrite the table in docs/scale.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    models = []
    with tempfile.TemporaryDirectory() as work:
        for config in args.configs:
            shapes = param_shapes(config, Path(work))
            ordered = list(shapes.values())
            sizes = [math.prod(shape) for shape in ordered]
            plain = measure(ordered, args.updates, None)
            packed = measure(ordered, args.updates, COMPRESSION)
            models.append({"config": config, "sizes": sizes, "plain": plain, "compressed": packed})
            print(f"{config}: {sum(sizes):,} parameters in {len(sizes)} arrays; "
                  f"plain {plain}; 2-bit {packed}", file=sys.stderr)  # fmt: skip
    table = report(models, args.bandwidth_gbit, args.step_seconds)
    print(table)
    if args.readme:
        write_readme(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
