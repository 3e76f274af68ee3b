"""Short full collections for long-running processes: what survives a full pass is frozen.

Why: CPython's full (generation 2) collection walks every object the cyclic collector tracks,
and holds the GIL while it does. A worker holds a few hundred thousand long-lived ones
(botocore's service models, Faust, aiokafka), the SES stand-in an index that grows with every
message; their full passes took 60–285 ms in a 3,120/s demo, stalling every SES call in flight
and, through the window pacer, the lanes' rate.

After each full pass the survivors move to the permanent generation (`gc.freeze`): they live
on by reference counting as before, and the next full pass walks only what was allocated
since. A frozen object that later becomes part of a garbage cycle is not reclaimed while
frozen, so every `unfreeze_every_s` the survivors go back (`gc.unfreeze`): the next full pass
walks everything once and reclaims such cycles.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

UNFREEZE_EVERY_S = 600.0


class FreezeAfterFullPass:
    """A `gc.callbacks` entry (see the module docstring)."""

    def __init__(
        self,
        unfreeze_every_s: float = UNFREEZE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.unfreeze_every_s = unfreeze_every_s
        self.clock = clock
        self.unfrozen_at = clock()
        self.freezes = 0
        self.unfreezes = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        now = self.clock()
        if now - self.unfrozen_at >= self.unfreeze_every_s:
            gc.unfreeze()  # the next full pass walks everything once
            self.unfrozen_at = now
            self.unfreezes += 1
        else:
            gc.freeze()
            self.freezes += 1


def install() -> FreezeAfterFullPass:
    """Add the callback to this process once; returns the one installed."""
    for callback in gc.callbacks:
        if isinstance(callback, FreezeAfterFullPass):
            return callback
    callback = FreezeAfterFullPass()
    gc.callbacks.append(callback)
    return callback
