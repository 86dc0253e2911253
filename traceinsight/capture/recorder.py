"""Drives torch.profiler around a script: schedule, step boundaries, budget, and the one trace file.

How the windows work. Steps are numbered from 0; step 0 is the start-up plus the first iteration
(everything before the first step boundary), as with ``prof.step()`` at the end of a loop body.

- Until the first boundary a plain profiler records operators only: no Python stacks, no shapes
  (on one compiled step those made stopping cost 14 s / 4.8 GB instead of 0 s / 0.54 GB). If the
  script never marks a step, that recording is the trace (the whole run is one window). When the
  first boundary comes it is stopped and discarded (never exported), unless the schedule records
  step 0 anyway.
- From the first boundary on, a scheduled profiler (``torch.profiler.schedule(wait, warmup,
  active, repeat)``, numbered so that its ``ProfilerStep#N`` is global step N) records the active
  steps with shapes and the stacks ``--stacks`` asks for (``user``: :mod:`.frames`; ``all``:
  torch's own tracer; ``none``). Each completed active window is exported over the same file
  (:mod:`.export`), so the file holds the last complete window.
- When the script ends in the middle of an active window, that partial window is exported only if
  no complete window was written before it.
- The memory budget (:mod:`.memory`): when a window would cost more, the start-up recording is
  dropped (profiling goes on at the first boundary), an active window is stopped and exported as
  it is, and nothing more is recorded.
- The script's own profiler: when the script starts a torch profiler of its own, the recorder
  steps aside (:mod:`.foreign`): it stops and drops what it is recording, records nothing more,
  and notes the traces the script exports.

Only the process that started the recorder touches the profiler or the file (forked DataLoader
workers inherit the hook but do nothing).

This is one of the few places that imports torch, always inside functions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from traceinsight.capture.export import ExportResult, ProgressCallback, write_trace
from traceinsight.capture.foreign import ForeignProfilerWatch
from traceinsight.capture.frames import UserFrameTracer
from traceinsight.capture.memory import DEFAULT_MAX_MEMORY, MemoryGuard
from traceinsight.capture.steps import StepMarker, activate_marker, deactivate_marker
from traceinsight.errors import CaptureError

if TYPE_CHECKING:
    from torch.optim import Optimizer
    from torch.profiler import profile as TorchProfile
    from torch.utils.hooks import RemovableHandle

__all__ = [
    "CaptureResult",
    "ProfileSettings",
    "RecorderEvents",
    "Stacks",
    "TraceRecorder",
    "cuda_available",
    "require_torch",
]

TORCH_INSTALL_COMMAND = "pip install 'torch-traceinsight[run]'"

Stacks = Literal["user", "all", "none"]
"""Which Python frames an active window records (``--stacks``)."""


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
    stacks: Stacks = "user"
    """Python frames of active windows: the user's code only, all, or none."""
    user_code: tuple[str, ...] = ()
    """Packages whose frames count as the user's (``--user-code``)."""
    max_memory_bytes: int = DEFAULT_MAX_MEMORY
    """Budget of one recording, the cost of stopping it included (``--max-memory``)."""
    record_startup: bool = True
    """Record from the start (the start-up window). False under torchrun: a gloo process group and
    DDP built while a profiler records deadlock at exit (see :mod:`.distributed`)."""

    @property
    def first_active_step(self) -> int:
        """Index of the first recorded step."""
        return self.wait + self.warmup


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """What the recorder left behind."""

    trace: Path | None
    """The trace file, or None when nothing was written."""
    steps_run: int
    """Step boundaries seen during the run (optimizer steps or explicit marks)."""
    steps_in_trace: int
    """Complete steps in the written window (0 for a whole-run window or a partial tail)."""
    whole_run: bool
    """True when no step was ever marked, so the trace covers the whole run (never after the
    memory budget stopped the window: the trace then ends there)."""
    cuda: bool
    """True when CUDA activity was recorded as well as CPU activity."""
    export: ExportResult | None = None
    """How the trace file was written (the last export)."""
    export_error: str | None = None
    """Why the trace could not be written, if it could not."""
    profiler_error: str | None = None
    """What torch.profiler raised, if it failed (profiling stopped there; the script went on)."""
    memory_stop: str | None = None
    """What the memory budget stopped (``"start-up"`` or ``"window"``), if anything."""
    memory_estimate_bytes: int | None = None
    """The estimated cost of the recording the budget stopped."""
    peak_rss_bytes: int = 0
    """Highest RSS seen while recording, stopping and writing."""
    foreign_profiler_at: str | None = None
    """Where the script started a profiler of its own (``file:line``); the recorder stepped aside."""
    foreign_traces: tuple[Path, ...] = field(default_factory=tuple)
    """Traces the script exported itself, in the order written (those that exist)."""


@dataclass(slots=True)
class RecorderEvents:
    """How the recorder tells the command what happens while the script runs (all optional)."""

    say: Callable[[str], None] = lambda text: None
    """One status line."""
    writing: Callable[[], contextlib.AbstractContextManager[ProgressCallback | None]] = lambda: (
        contextlib.nullcontext(None)
    )
    """Context around stopping and writing a window; yields a progress callback or None."""
    written: Callable[[ExportResult], None] = lambda export: None
    """A window was written (said at once, so a long export ends visibly where it happened)."""


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C back until the block ends (then it arrives as usual): torch's C++ start-up
    aborts the process (SIGABRT, "terminate called … KeyboardInterrupt") when interrupted."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def require_torch() -> None:
    """Raise :class:`CaptureError` with the install command when torch cannot be imported."""
    try:
        with _sigint_deferred():
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

    def __init__(
        self, settings: ProfileSettings, trace_path: Path, events: RecorderEvents | None = None
    ) -> None:
        self.settings = settings
        self.trace_path = trace_path
        self.events = events or RecorderEvents()
        self._owner_pid = os.getpid()
        self._cuda = False
        self._schedule: Callable[[int], Any] | None = None
        self._startup_profiler: TorchProfile | None = None
        self._scheduled_profiler: TorchProfile | None = None
        self._hook_handle: RemovableHandle | None = None
        self._marker = StepMarker(self._on_step_end)
        self._frames: UserFrameTracer | None = None
        self._guard = MemoryGuard(settings.max_memory_bytes, self._stop_for_memory)
        self._foreign = ForeignProfilerWatch(self._step_aside)
        self._own_calls = 0
        self._discarding = False
        self._stopping = False
        self._done = False
        self._steps_in_window = 0
        self._steps_in_trace = 0
        self._trace_written = False
        self._export: ExportResult | None = None
        self._export_error: str | None = None
        self._profiler_error: str | None = None
        self._memory_stop: str | None = None
        self._writing: contextlib.AbstractContextManager[ProgressCallback | None] | None = None
        self._progress: ProgressCallback | None = None

    @property
    def steps_run(self) -> int:
        """Step boundaries seen so far."""
        return self._marker.steps_ended

    @property
    def records_cuda(self) -> bool:
        """True once started if CUDA activity is recorded too (a CUDA device is present)."""
        return self._cuda

    def start(self) -> None:
        """Start profiling and listen for step boundaries (optimizer hook and :func:`step`)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.profiler import schedule

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
            with self._own():
                if not self.settings.record_startup:
                    pass  # nothing until the first step boundary
                elif self._records(self._schedule(0)):
                    # Step 0 is recorded anyway: one scheduled profiler from the start.
                    self._scheduled_profiler = self._new_profiler(scheduled=True)
                    self._scheduled_profiler.start()
                    self._window_may_have_started()
                else:
                    self._startup_profiler = self._new_profiler(scheduled=False)
                    self._startup_profiler.start()
                    self._guard.arm()
            self._foreign.install()
        except BaseException:
            self._stop_listening()
            raise

    def finish(self, *, discard: bool = False) -> CaptureResult:
        """Stop profiling, write what was recorded (see the module doc) and stop listening.

        ``discard``: write nothing (the script exited before its first step, e.g. ``--help``).
        """
        if os.getpid() != self._owner_pid:
            # A forked child that returned through our code: the profiler belongs to the parent.
            return self._result()
        self._stop_listening()
        self._foreign.remove()
        self._stopping = True
        self._discarding = discard
        self._stop_frames()
        self._stop_profilers()
        self._guard.close()
        return self._result()

    def _stop_profilers(self) -> None:
        for profiler in (self._startup_profiler, self._scheduled_profiler):
            if profiler is None:
                continue
            try:
                with self._own(), self._writing_window():
                    profiler.stop()
            except Exception as error:  # keep what was written; say why the rest is missing
                self._profiler_error = self._profiler_error or f"{type(error).__name__}: {error}"
        self._startup_profiler = self._scheduled_profiler = None
        self._guard.disarm()

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
            # a window stopped for memory stopped counting steps too: it is not the whole run
            whole_run=self._marker.steps_ended == 0 and self._memory_stop != "window",
            cuda=self._cuda,
            export=self._export,
            export_error=self._export_error,
            profiler_error=self._profiler_error,
            memory_stop=self._memory_stop,
            memory_estimate_bytes=self._guard.tripped_at_bytes if self._memory_stop else None,
            peak_rss_bytes=self._guard.peak_bytes,
            foreign_profiler_at=self._foreign.started_at,
            foreign_traces=tuple(path for path in self._foreign.exported if path.is_file()),
        )

    @contextlib.contextmanager
    def _own(self) -> Iterator[None]:
        """Marks our own calls into torch.profiler (the foreign-profiler watch ignores them)."""
        self._own_calls += 1
        try:
            with self._foreign.ours(), self._guard.deferred():
                yield
        finally:
            self._own_calls -= 1

    @contextlib.contextmanager
    def _writing_window(self) -> Iterator[None]:
        """Around a stop that may export: the command's progress display, opened once."""
        if self._writing is not None or self._discarding:
            yield
            return
        self._writing = self.events.writing()
        self._progress = self._writing.__enter__()
        try:
            yield
        finally:
            writing, self._writing, self._progress = self._writing, None, None
            writing.__exit__(None, None, None)

    def _new_profiler(self, *, scheduled: bool) -> TorchProfile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self._cuda:
            activities.append(ProfilerActivity.CUDA)
        options: dict[str, Any] = {
            "activities": activities,
            # The start-up window is usually thrown away: operators only (see the module doc).
            "record_shapes": scheduled,
            "with_stack": scheduled and self.settings.stacks == "all",
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
        if self._profiler_error is not None or self._done:
            return
        try:
            with self._own():
                self._advance_schedule()
        except Exception as error:
            self._profiler_error = f"{type(error).__name__}: {error}"

    def _advance_schedule(self) -> None:
        from torch.profiler import ProfilerAction

        if self._scheduled_profiler is None:
            # First boundary: the start-up recording is not needed any more.
            self._drop_startup()
            scheduled = self._new_profiler(scheduled=True)
            scheduled.start()  # at step 0, which is already over: the schedule says wait or warm up
            scheduled.step()
            self._scheduled_profiler = scheduled
            self._window_may_have_started()
            return
        action = self._scheduled_profiler.current_action
        if self._records(action):
            self._steps_in_window += 1
        if action == ProfilerAction.RECORD_AND_SAVE:
            # This step closes the window: the profiler stops and exports inside step().
            self._stop_frames()
            self._guard.disarm()
            steps = self._steps_in_window
            self.events.say(f"recorded {steps} step{'' if steps == 1 else 's'}; writing the trace…")
        with warnings.catch_warnings(), self._writing_window():
            # Said when a second cycle starts; keeping only the last window is what we want.
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
            self._scheduled_profiler.step()
        self._window_may_have_started()

    def _window_may_have_started(self) -> None:
        """After a schedule move: when the profiler now records, start the user frames and the watch."""
        profiler = self._scheduled_profiler
        if profiler is None or not self._records(profiler.current_action):
            return
        if self.settings.stacks == "user" and self._frames is None:
            self._frames = UserFrameTracer(self.settings.user_code)
            self._frames.start()
        self._guard.arm()

    def _stop_frames(self) -> None:
        frames, self._frames = self._frames, None
        if frames is not None:
            frames.stop()

    def _drop_startup(self) -> None:
        startup, self._startup_profiler = self._startup_profiler, None
        if startup is None:
            return
        self._guard.disarm()
        self._discarding = True
        try:
            startup.stop()
        finally:
            self._discarding = False

    def _stop_for_memory(self) -> None:
        """The budget is about to be passed (called on the main thread by the guard)."""
        if self._startup_profiler is not None:
            self._memory_stop = "start-up"
            with self._own():
                self._drop_startup()
            return
        if self._scheduled_profiler is None:
            return
        self._memory_stop = "window"
        self._done = True
        self._stop_listening()
        self._stop_frames()
        self.events.say(
            f"recording stopped early: it would pass the memory budget "
            f"({_gib(self.settings.max_memory_bytes)}, --max-memory); writing what was recorded…"
        )
        self._stopping = True
        self._stop_profilers()

    def _step_aside(self) -> None:
        """The script starts a profiler of its own: stop and drop ours, record nothing more."""
        self._done = True
        self._stop_listening()
        self._stop_frames()
        self._discarding = True
        try:
            self._stop_profilers()
        finally:
            self._discarding = False

    @staticmethod
    def _records(action: Any) -> bool:
        from torch.profiler import ProfilerAction

        return action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def _on_trace_ready(self, profiler: TorchProfile) -> None:
        """Export a finished window over the trace file (atomically), following the module's rules."""
        if self._discarding:
            return
        if self._stopping and self._trace_written:
            return  # keep the last complete window rather than the partial one the script ended in
        steps_in_window = self._steps_in_window
        self._steps_in_window = 0
        try:
            self._export = write_trace(profiler, self.trace_path, self._progress)
        except OSError as error:
            self._export_error = f"{error.strerror or error}"
            return
        self._trace_written = True
        self._steps_in_trace = steps_in_window
        self.events.written(self._export)


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def _cuda_sync_events_config() -> Any:
    """The experimental config that records CUDA sync events, or None if this torch has none."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, AttributeError, TypeError):
        return None
