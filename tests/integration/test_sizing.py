"""scripts/sizing.py: bytes per update measured on loopback, and the server arithmetic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sizing() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sizing", ROOT / "scripts" / "sizing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sizing"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_push_and_pull_bytes_are_measured_on_loopback(sizing: ModuleType) -> None:
    """A real 1-worker, 1-server dist_sync job: float32 both ways, and 2-bit compression
    cuts the push to 1/16 while the pull stays float32."""
    shapes = [(1000, 300), (1200, 1000), (7,)]  # one array above MXNet's big-array bound
    floats = 300_000 + 1_200_000 + 7
    plain = sizing.measure(shapes, 3, None)
    # Bytes, not floats or times: the payload plus ZeroMQ/ps-lite framing, a few dozen bytes
    # per message (a push and a pull per array; ~250 bytes an update here), which no CPU or
    # load changes; 2% of 6 MB and 5% of the 2-bit push's 375 KB leave it ample room.
    assert plain["sent_per_update"] == pytest.approx(floats * 4, rel=0.02)
    assert plain["received_per_update"] == pytest.approx(floats * 4, rel=0.02)
    packed = sizing.measure(shapes, 3, sizing.COMPRESSION)
    assert packed["sent_per_update"] == pytest.approx(floats * 4 / 16, rel=0.05)
    assert packed["received_per_update"] == pytest.approx(floats * 4, rel=0.02)


def test_server_placement_and_the_servers_needed(sizing: ModuleType) -> None:
    # a 2e6-element array splits evenly; small ones go whole to (key * 9973) % servers
    loads = sizing.server_loads([2_000_000, 10, 20], 4, compressed=False)
    # key 1 -> 9973 % 4 = server 1 (40 bytes), key 2 -> 19946 % 4 = server 2 (80 bytes)
    assert [pull for _, pull in loads] == [2_000_000, 2_000_040, 2_000_080, 2_000_000]
    assert loads == [(pull, pull) for _, pull in loads]  # uncompressed: push = pull
    assert sizing.push_bytes(32, compressed=True) == 8 and sizing.push_bytes(33, True) == 12
    one_gbyte = 1e9
    # 100 MB of float32 per worker, 8 workers, 1 GB/s, 1 s: 800 MB each way -> 1 server
    sizes = [25_000_000]
    plan = sizing.servers_needed(sizes, 8, False, one_gbyte, 1.0, (1.0, 1.0))
    assert plan.servers == 1
    plan = sizing.servers_needed(sizes, 64, False, one_gbyte, 1.0, (1.0, 1.0))
    assert plan.servers == 7  # 6.4 GB per step over servers that move 1 GB each
    # the pull is not compressed, so 2-bit compression needs as many servers
    assert sizing.servers_needed(sizes, 64, True, one_gbyte, 1.0, (1.0, 1.0)).servers == 7
    # a worker whose own link cannot move its update in one step: no server count helps
    slow = sizing.servers_needed(sizes, 8, False, one_gbyte, 0.05, (1.0, 1.0))
    assert slow.servers is None and "own link" in slow.reason
