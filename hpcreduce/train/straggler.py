"""Straggler injection (``--slow RANK:FACTOR``): a rank whose compute takes FACTOR times as long.

    factor = factor_for(config.fault, stable_id)       # 1.0 unless this rank is slowed
    with slow_down(factor):
        output = model.loss_and_grads(params, batch)

``slow_down`` times the block and then sleeps (factor - 1) x that time, so the block
with its sleep lasts factor x as long as the block alone, however fast or slow the
machine is today: a rank that really is slower (another job on its cores, a smaller
GPU), not a fixed delay. The sleep gives its cores to the other ranks. The block's time
is the lesser of its wall time and the process's CPU time over it: a block the scheduler
paused (other ranks on its core) is not stretched by the pause x factor (a 0.1 ms unit
paused for 150 ms once slept 150 s at factor 1000), and a block on several threads
counts its wall time.
Every delay is counted (``injected_s``: the timeline shows it inside the phase it slowed).
Cost: none on the wire; factor - 1 times the block's time on the slowed rank.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from ..ft.faults import FaultConfig

_injected = [0.0]


def factor_for(fault: FaultConfig, stable_id: int) -> float:
    """How many times as long the rank with ``stable_id`` computes (1.0 when not slowed)."""
    return next((factor for rank, factor in fault.slow if rank == stable_id), 1.0)


@contextmanager
def slow_down(factor: float) -> Iterator[None]:
    """Around a compute block: afterwards sleep (factor - 1) x the block's time, the lesser of
    wall and CPU time (nothing at 1.0; nothing either when the block raises)."""
    if factor == 1.0:
        yield
        return
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    delay = (factor - 1.0) * min(time.perf_counter() - wall, time.process_time() - cpu)
    _injected[0] += delay
    time.sleep(delay)


def injected_s() -> float:
    """The seconds of delay ``slow_down`` injected into this process so far."""
    return _injected[0]
