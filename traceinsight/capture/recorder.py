"""Drives torch.profiler around a script: schedule, step boundaries, and the one trace file.

How the windows work. Steps are numbered from 0; step 0 is the start-up plus the first iteration
(everything before the first step boundary), as with ``prof.step()`` at the end of a loop body.

- Until the first boundary a plain profiler records everything: if the script never marks a step,
  that recording is the trace (the whole run is one window). When the first boundary comes it is
  stopped and discarded (never exported), unless the schedule records step 0 anyway.
- From the first boundary on, a scheduled profiler (``torch.profiler.schedule(wait, warmup,
  active, repeat)``, numbered so that its ``ProfilerStep#N`` is global step N) records the active
  steps; each completed active window is exported over the same file, so the file holds the last
  complete window.
- When the script ends in the middle of an active window, that partial window is exported only if
  no complete window was written before it.

Only the process that started the recorder touches the profiler or the file (forked DataLoader
workers inherit the hook but do nothing).

This is one of the few places that imports torch, always inside functions.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceinsight.capture.steps import StepMarker, activate_marker, deactivate_marker
from traceinsight.errors import CaptureError

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.optim import Optimizer
    from torch.profiler import profile as TorchProfile
    from torch.utils.hooks import RemovableHandle

__all__ = ["CaptureResult", "ProfileSettings", "TraceRecorder", "cuda_available", "require_torch"]

TORCH_INSTALL_COMMAND = "pip install 'torch-traceinsight[run]'"


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What to record and when; the schedule counts steps as :mod:`traceinsight.capture.recorder` says."""

    wait: int = 1
    """Steps skipped at the start (step 0 holds the start-up)."""
    warmup: int = 2
    """Steps profiled but thrown away, so that the profiler's own start-up cost is not measured."""
    active: int = 5
    """Steps recorded into the trace."""
    repeat: int = 1
    """How many wait/warm-up/active cycles to run (0: until the script ends); the last one is kept."""
    profile_memory: bool = False
    """Record allocator events (``[memory]`` instant events)."""

    @property
    def first_active_step(self) -> int:
        """Index of the first recorded step."""
        return self.wait + self.warmup


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """What the recorder left behind."""

    trace: Path | None
    """The trace file, or None when nothing was recorded (the schedule never reached an active step)."""
    steps_run: int
    """Step boundaries seen during the run (optimizer steps or explicit marks)."""
    steps_in_trace: int
    """Complete steps in the written window (0 for a whole-run window or a partial tail)."""
    whole_run: bool
    """True when no step was ever marked, so the trace covers the whole run."""
    cuda: bool
    """True when CUDA activity was recorded as well as CPU activity."""
    export_error: str | None = None
    """Why the trace could not be written, if it could not."""
    profiler_error: str | None = None
    """What torch.profiler raised, if it failed (profiling stopped there; the script went on)."""


def require_torch() -> None:
    """Raise :class:`CaptureError` with the install command when torch cannot be imported."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise CaptureError(
            f"cannot profile: torch is not importable in this Python ({error}); "
            f"install it with: {TORCH_INSTALL_COMMAND}"
        ) from None


def cuda_available() -> bool:
    """True when torch sees a CUDA device (so CUDA activity can be recorded)."""
    import torch

    return bool(torch.cuda.is_available())


class TraceRecorder:
    """Profiles the current process between :meth:`start` and :meth:`finish` into one trace file."""

    def __init__(self, settings: ProfileSettings, trace_path: Path) -> None:
        self.settings = settings
        self.trace_path = trace_path
        self._owner_pid = os.getpid()
        self._cuda = False
        self._schedule: Callable[[int], Any] | None = None
        self._startup_profiler: TorchProfile | None = None
        self._scheduled_profiler: TorchProfile | None = None
        self._hook_handle: RemovableHandle | None = None
        self._marker = StepMarker(self._on_step_end)
        self._discarding = False
        self._stopping = False
        self._steps_in_window = 0
        self._steps_in_trace = 0
        self._trace_written = False
        self._export_error: str | None = None
        self._profiler_error: str | None = None

    @property
    def records_cuda(self) -> bool:
        """True once started if CUDA activity is recorded too (a CUDA device is present)."""
        return self._cuda

    def start(self) -> None:
        """Start profiling and listen for step boundaries (optimizer hook and :func:`step`)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import ProfilerAction, schedule

        self._cuda = cuda_available()
        with warnings.catch_warnings():
            # torch warns when warmup is 0; the user chose it on the command line.
            warnings.simplefilter("ignore", UserWarning)
            self._schedule = schedule(
                wait=self.settings.wait,
                warmup=self.settings.warmup,
                active=self.settings.active,
                repeat=self.settings.repeat,
            )
        self._hook_handle = register_optimizer_step_post_hook(self._on_optimizer_step)
        activate_marker(self._marker)
        try:
            if self._schedule(0) in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
                # Step 0 is recorded anyway: one scheduled profiler from the start.
                self._scheduled_profiler = self._new_profiler(scheduled=True)
                self._scheduled_profiler.start()
            else:
                self._startup_profiler = self._new_profiler(scheduled=False)
                self._startup_profiler.start()
        except BaseException:
            self._stop_listening()
            raise

    def finish(self) -> CaptureResult:
        """Stop profiling, write what was recorded (see the module doc) and stop listening."""
        if os.getpid() != self._owner_pid:
            # A forked child that returned through our code: the profiler belongs to the parent.
            return self._result()
        self._stop_listening()
        self._stopping = True
        for profiler in (self._startup_profiler, self._scheduled_profiler):
            if profiler is None:
                continue
            try:
                profiler.stop()
            except Exception as error:  # keep what was written; say why the rest is missing
                self._profiler_error = self._profiler_error or f"{type(error).__name__}: {error}"
        self._startup_profiler = self._scheduled_profiler = None
        return self._result()

    def _stop_listening(self) -> None:
        deactivate_marker()
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None

    def _result(self) -> CaptureResult:
        return CaptureResult(
            trace=self.trace_path if self._trace_written else None,
            steps_run=self._marker.steps_ended,
            steps_in_trace=self._steps_in_trace,
            whole_run=self._marker.steps_ended == 0,
            cuda=self._cuda,
            export_error=self._export_error,
            profiler_error=self._profiler_error,
        )

    def _new_profiler(self, *, scheduled: bool) -> TorchProfile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        options: dict[str, Any] = {
            "activities": activities,
            "record_shapes": True,
            "with_stack": True,
            "profile_memory": self.settings.profile_memory,
            "on_trace_ready": self._on_trace_ready,
        }
        if scheduled:
            options["schedule"] = self._schedule
        sync_events = _cuda_sync_events_config()
        if sync_events is not None:
            try:
                return profile(**options, experimental_config=sync_events)
            except TypeError:
                pass  # this torch's profiler does not take the option: profile without sync events
        return profile(**options)

    def _on_optimizer_step(self, optimizer: Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._marker.optimizer_stepped(id(optimizer))

    def _on_step_end(self) -> None:
        """One step just ended (called by the marker, in the owner process only).

        Runs inside the script's ``optimizer.step()``: a profiler failure must not stop the
        training, so it is kept, profiling stops there, and the end of the run reports it.
        """
        if self._profiler_error is not None:
            return
        try:
            self._advance_schedule()
        except Exception as error:
            self._profiler_error = f"{type(error).__name__}: {error}"

    def _advance_schedule(self) -> None:
        from torch.profiler import ProfilerAction

        if self._scheduled_profiler is None:
            # First boundary: the start-up recording is not needed any more.
            if self._startup_profiler is not None:
                self._discarding = True
                try:
                    self._startup_profiler.stop()
                finally:
                    self._discarding = False
                    self._startup_profiler = None
            scheduled = self._new_profiler(scheduled=True)
            scheduled.start()  # at step 0, which is already over: the schedule says wait or warm up
            scheduled.step()
            self._scheduled_profiler = scheduled
            return
        if self._scheduled_profiler.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._steps_in_window += 1
        with warnings.catch_warnings():
            # Said when a second cycle starts; keeping only the last window is what we want.
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
            self._scheduled_profiler.step()

    def _on_trace_ready(self, profiler: TorchProfile) -> None:
        """Export a finished window over the trace file (atomically), following the module's rules."""
        if self._discarding:
            return
        if self._stopping and self._trace_written:
            return  # keep the last complete window rather than the partial one the script ended in
        steps_in_window = self._steps_in_window
        self._steps_in_window = 0
        partial_path = self.trace_path.with_name(f".{self.trace_path.name}.{os.getpid()}.partial")
        if self.trace_path.name.endswith(".gz"):
            partial_path = partial_path.with_name(partial_path.name + ".gz")  # torch gzips by suffix
        try:
            profiler.export_chrome_trace(str(partial_path))
            os.replace(partial_path, self.trace_path)
        except OSError as error:
            self._export_error = f"{error.strerror or error}"
            partial_path.unlink(missing_ok=True)
            return
        self._trace_written = True
        self._steps_in_trace = steps_in_window


def _cuda_sync_events_config() -> Any:
    """The experimental config that records CUDA sync events, or None if this torch has none."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, AttributeError, TypeError):
        return None
