"""torchrun: one folder per job, the rank in every file name, and the launcher as a target.

Under torchrun (``RANK`` and ``WORLD_SIZE`` set, ``WORLD_SIZE`` > 1) every rank runs its own
``traceinsight run``. They must agree on one job folder without talking to each other: its name
is the script's stem and the start time of the process that launched them (the torchrun agent,
the ranks' common parent), so ``train.20261122-101500.job/train.rank1.pt.trace.json.gz``.

Nothing is recorded before a rank's first step. A gloo process group and its DDP model built while
a profiler records made the job hang at exit (5 runs in 8 under `run`, 1 in 5 with only a
profiler around start-up, 0 in 10 with a profiler only around steps 2-5, 0 in 10 alone, 0 in 10
once nothing is recorded before the first step; torch 2.13 CPU): at the end of ``main()`` the main thread, holding the GIL, destroys the DDP ``Reducer`` and
so the ``ProcessGroupGloo``, whose destructor waits for the work mutex; a gloo ``runLoop`` thread
holds that mutex while it destroys its last ``AsyncAllreduceWork``, whose captured
``at::ThreadLocalState`` holds a Python object (the ``contextvars`` context torch stashes during
``backward``), and waits for the GIL. So under torchrun the start-up window is not recorded.

``traceinsight run -m torch.distributed.run ARGS`` (or ``traceinsight run torchrun ARGS``) would
profile the launcher, which only waits for its workers. Instead the launcher runs unprofiled with
its worker command turned into ``python -m traceinsight run [our options] SCRIPT ARGS``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from traceinsight.errors import CaptureError
from traceinsight.model import Model

__all__ = [
    "LAUNCHER_MODULES",
    "RankInfo",
    "job_stamp",
    "launcher_module",
    "rank_info",
    "rank_path",
    "worker_launch_args",
]

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
"""Modules that launch workers; as a target, their workers are profiled instead."""


class RankInfo(Model, frozen=True):
    """This process's place in a torchrun job."""

    rank: int
    world_size: int


def rank_info() -> RankInfo | None:
    """The rank and world size torchrun set, or None outside a multi-process job."""
    try:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world_size <= 1 or not 0 <= rank < world_size:
        return None
    return RankInfo(rank=rank, world_size=world_size)


def job_stamp() -> str:
    """``YYYYmmdd-HHMMSS`` shared by every rank of this node: the start time of their parent."""
    started = _parent_start_time()
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(started if started is not None else None))


def _parent_start_time() -> float | None:
    """When the parent process started (seconds since the epoch), from /proc; None elsewhere."""
    try:
        with open(f"/proc/{os.getppid()}/stat", encoding="ascii") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat; fields[0] is field 3
        with open("/proc/stat", encoding="ascii") as system_stat:
            boot = next(int(line.split()[1]) for line in system_stat if line.startswith("btime"))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


def rank_path(path: Path, rank: int) -> Path:
    """``path`` for one rank: ``{rank}`` in the name is replaced, else ``.rankN`` goes before the suffixes."""
    if "{rank}" in path.name:
        return path.with_name(path.name.replace("{rank}", str(rank)))
    stem, dot, suffixes = path.name.partition(".")
    return path.with_name(f"{stem}.rank{rank}{dot}{suffixes}")


def launcher_module(name: str, is_module: bool) -> bool:
    """True when the target is torchrun itself (``-m torch.distributed.run`` or the ``torchrun`` script)."""
    if is_module:
        return name in LAUNCHER_MODULES
    path = Path(name)
    if not path.is_file():
        found = shutil.which(name) if os.sep not in name else None
        if found is None:
            return False
        path = Path(found)
    if path.name not in ("torchrun", "torchrun.py"):
        return False
    try:
        return "torch.distributed.run" in path.read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        return False


def worker_launch_args(launcher_args: tuple[str, ...], our_options: list[str]) -> list[str]:
    """The launcher's arguments with its worker command wrapped in ``python -m traceinsight run``."""
    from torch.distributed.run import get_args_parser

    try:
        parsed = get_args_parser().parse_args(list(launcher_args))
    except SystemExit:
        raise CaptureError(
            "cannot profile the torchrun job: torchrun rejected its arguments (see above); "
            "check them with torchrun alone first"
        ) from None
    if parsed.no_python:
        raise CaptureError(
            "cannot profile a torchrun job started with --no-python: put traceinsight inside the "
            "worker command instead, e.g. torchrun --no-python ... traceinsight run train.py"
        )
    tail = 1 + len(parsed.training_script_args)
    options = [word for word in launcher_args[: len(launcher_args) - tail] if word not in ("-m", "--module")]
    module_flag = ["-m"] if parsed.module else []
    return [
        *options,
        "--no-python",
        sys.executable,
        "-m",
        "traceinsight",
        "run",
        *our_options,
        *module_flag,
        parsed.training_script,
        *parsed.training_script_args,
    ]
