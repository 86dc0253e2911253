"""What a recording records and when (:class:`ProfileSettings`): what `run`'s options read, apart
from the recorder (:mod:`.recorder`) and what it loads, so that the command's options are made
without them (~15-20 ms of every command's start)."""

from __future__ import annotations

from typing import Literal

from traceinsight.model import Model

__all__ = ["DEFAULT_MAX_MEMORY", "ProfileSettings", "Stacks"]

DEFAULT_MAX_MEMORY = 2 << 30
"""Default budget of one recording (``--max-memory``): 2 GiB, stop included. Here, not with the
budget's guard (:mod:`.memory`): the command's options read it, and ``analyze`` need not load the
guard."""

Stacks = Literal["user", "all", "none"]
"""Which Python frames an active window records (``--stacks``)."""


class ProfileSettings(Model, frozen=True):
    """What to record and when; the schedule counts steps as :mod:`traceinsight.capture.recorder` says."""

    wait: int = 1
    """Steps skipped at the start (step 0 holds the start-up)."""
    warmup: int = 2
    """Steps profiled but thrown away, so that the profiler's own start-up cost is not measured."""
    active: int = 5
    """Steps recorded into the trace."""
    repeat: int = 1
    """How many wait/warm-up/active cycles to run (0: until the script ends); with more than one,
    every cycle's trace is kept (:attr:`keeps_cycles`)."""
    profile_memory: bool = False
    """Record allocator events (``[memory]`` instant events)."""
    stacks: Stacks = "user"
    """Python frames of active windows: the user's code only, all, or none."""
    user_code: tuple[str, ...] = ()
    """Packages whose frames count as the user's (``--user-code``)."""
    max_memory_bytes: int = DEFAULT_MAX_MEMORY
    """Budget of one recording, the cost of stopping it included (``--max-memory``)."""
    record_startup: bool = True
    """Record from the start (the start-up window). False under torchrun: a gloo process group and
    DDP built while a profiler records deadlock at exit (see :mod:`.distributed`)."""

    keep_cycles: bool = True
    """With ``repeat`` other than 1, write each cycle to its own file (named as
    ``tensorboard_trace_handler`` names its cycles, so that ``diff`` pools them); False under
    torchrun, where a folder of ranks' traces must stay one trace a rank (the last cycle is kept)."""

    @property
    def keeps_cycles(self) -> bool:
        """True when every cycle is written to its own file, not the last one over the trace."""
        return self.repeat != 1 and self.keep_cycles

    @property
    def first_active_step(self) -> int:
        """Index of the first recorded step."""
        return self.wait + self.warmup
