"""Full collections freeze their survivors, and let them go again now and then.

The callback is driven by hand here (a fake clock, the pytest process's own collector state
restored after each test); the last three tests run a real process, where CPython itself calls
it.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from flashsend.gc_pauses import FreezeAfterFullPass

FULL = {"generation": 2, "collected": 0, "uncollectable": 0}


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_full_pass_freezes_its_survivors() -> None:
    freezer = FreezeAfterFullPass(600.0, Clock())
    freezer("stop", FULL)
    assert gc.get_freeze_count() > 0
    assert freezer.freezes == 1


@pytest.mark.parametrize(
    ("phase", "generation"), [("stop", 0), ("stop", 1), ("start", 2)], ids=["gen0", "gen1", "start"]
)
def test_young_passes_and_the_start_of_a_full_one_freeze_nothing(
    phase: str, generation: int
) -> None:
    freezer = FreezeAfterFullPass(600.0, Clock())
    freezer(phase, {**FULL, "generation": generation})
    assert gc.get_freeze_count() == 0
    assert freezer.freezes == 0


def test_the_survivors_go_back_once_the_period_is_over_then_freezing_resumes() -> None:
    clock = Clock()
    freezer = FreezeAfterFullPass(600.0, clock)
    freezer("stop", FULL)
    clock.now += 599.0
    freezer("stop", FULL)
    assert (freezer.freezes, freezer.unfreezes) == (2, 0)
    clock.now += 1.0
    freezer("stop", FULL)
    assert gc.get_freeze_count() == 0  # the next full pass walks everything
    assert (freezer.freezes, freezer.unfreezes) == (2, 1)
    freezer("stop", FULL)
    assert gc.get_freeze_count() > 0
    assert freezer.unfreezes == 1  # the period starts again at the unfreeze


PROBE = """
import gc, sys
from flashsend import gc_pauses
first = gc_pauses.install()
assert gc_pauses.install() is first  # once per process
gc.collect()
frozen = gc.get_freeze_count()
# A cycle made after the freeze is still the collector's: the next full pass reclaims it.
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
del a, b
reclaimed = gc.collect()
print(frozen, reclaimed, first.freezes)
"""


def test_installed_in_a_process_cpython_calls_it_and_new_cycles_are_still_reclaimed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    frozen, reclaimed, freezes = map(int, out.stdout.split())
    assert frozen > 1000  # the interpreter's and the modules' objects
    assert reclaimed >= 2
    assert freezes >= 2


def _installed_after(call: str) -> str:
    """How many freezer callbacks a new process has after running `call` (one statement) as
    `flashsend status-stack`; its stderr's tail when it printed nothing."""
    script = (
        "import gc, runpy, sys\n"
        "from importlib.metadata import entry_points\n"
        "from flashsend.cli.entry import main\n"
        "from flashsend.gc_pauses import FreezeAfterFullPass\n"
        "sys.argv = ['flashsend', 'status-stack']\n"
        "try:\n"
        f"    {call}\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sum(isinstance(c, FreezeAfterFullPass) for c in gc.callbacks))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]


def test_the_flashsend_program_installs_it() -> None:
    console = "entry_points(group='console_scripts', name='flashsend')['flashsend'].load()()"
    assert _installed_after(console) == "1"
    as_module = "runpy.run_module('flashsend.cli', run_name='__main__')"
    assert _installed_after(as_module) == "1"  # how workers, the webhook and the puller start


def test_main_called_in_process_leaves_the_hosts_collector_alone() -> None:
    """Frozen objects are invisible to gc.get_referrers (Hypothesis's register_random check
    relies on it), so a test that calls main() must not freeze the test run's heap."""
    assert _installed_after("main(['status-stack'])") == "0"
