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
  (:mod:`.export`), so the file holds the last complete window; with ``--repeat`` other than 1
  (:attr:`.settings.ProfileSettings.keeps_cycles`) each window goes to a file of its own instead,
  named as ``tensorboard_trace_handler`` names its cycles (:func:`cycle_path`), so that ``diff``
  pools the cycles of a run (and of repeated runs) as one side of several runs.
- When the script ends in the middle of an active window, that partial window is exported only if
  no complete window was written before it.
- The memory budget (:mod:`.memory`): when a window would cost more, the start-up recording is
  dropped (profiling goes on at the first boundary); an active window ends at the step boundary
  where one more step would pass the budget (complete steps only), or, when a single step is too
  big, is stopped in the middle and exported as it is; then nothing more is recorded. Profilers
  stop with ``trace_only`` (no Python event objects: the export does not need them), and once a
  window is written (or the start-up one dropped) its results are released and the freed heap is
  given back to the system.
- A profiler is never started inside the ``Optimizer.step#`` range of a step that another
  profiler recorded: the range's end would reach the new profiler with the old one's (freed) event,
  which corrupted the heap (``--warmup 0``: the start-up recording stops and step 1's starts at
  the same boundary; 7 crashes in 10 runs). Such a move waits for ``optimizer.step()`` to return.
- The DataLoader's fetch records as its ``enumerate(DataLoader)#…`` range alone while a window
  records (:mod:`.fetch`): its operators are not collected, and the trace's ``traceinsight``
  record says so (``"loaderFetch": "range only"``).
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
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from traceinsight.capture.export import ExportResult, ProgressCallback, write_trace
from traceinsight.capture.fetch import LOADER_FETCH_RANGE_ONLY, FetchOpsPaused
from traceinsight.capture.foreign import ForeignProfilerWatch
from traceinsight.capture.frames import UserFrameTracer
from traceinsight.capture.memory import (
    STOP_PER_HELD_BYTE,
    STOP_PER_HELD_BYTE_WITH_EVENTS,
    MemoryGuard,
    release_freed_memory,
)
from traceinsight.capture.quiet import KinetoLinesDropped
from traceinsight.capture.settings import ProfileSettings, Stacks
from traceinsight.capture.steps import StepMarker, activate_marker, deactivate_marker
from traceinsight.errors import CaptureError
from traceinsight.load.tables import STEP_USAGE_KEPT, StepUsage
from traceinsight.model import Model, field

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
    "cycle_path",
    "require_torch",
]

TORCH_INSTALL_COMMAND = "pip install 'torch-traceinsight[run]'"


class CaptureResult(Model, frozen=True):
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
    """What the memory budget stopped, if anything: ``"start-up"`` (the start-up recording was
    dropped), ``"boundary"`` (the window ended at a step boundary: one more step would have passed
    the budget) or ``"window"`` (stopped inside a step)."""
    memory_estimate_bytes: int | None = None
    """The estimated cost that made the budget stop a recording (with ``"boundary"``: after one
    more step)."""
    peak_rss_bytes: int = 0
    """Highest RSS seen while recording, stopping and writing."""
    foreign_profiler_at: str | None = None
    """Where the script started a profiler of its own (``file:line``); the recorder stepped aside."""
    foreign_traces: tuple[Path, ...] = field(default_factory=tuple)
    """Traces the script exported itself, in the order written (those that exist)."""
    foreign_partial: tuple[Path, ...] = field(default_factory=tuple)
    """Those of :attr:`foreign_traces` exported when a scheduled profiler stopped mid-window."""
    step_usage: tuple[StepUsage, ...] = field(default_factory=tuple)
    """Each step of the written window as the process lived it (see :class:`StepUsage`)."""
    after_window_ns: tuple[int, ...] = field(default_factory=tuple)
    """Wall time of each step that ran unrecorded after the written window (the first
    :data:`_BASELINE_STEPS`, in order; the first one also wrote the trace): the steady steps that
    tell what recording cost, which the trace cannot hold (it is written before they run)."""
    cycles: tuple[Path, ...] = field(default_factory=tuple)
    """With :attr:`~.settings.ProfileSettings.keeps_cycles`: every window's file, in the order
    written (:attr:`trace` is the last)."""


def cycle_path(trace: Path, time_ns: int) -> Path:
    """Where one cycle's window is written when every cycle is kept: ``--trace``'s name with the
    cycle's time (ns since the epoch) before ``.pt.trace.json[.gz]``, as
    ``tensorboard_trace_handler`` names its cycles (``<worker>.<time_ns>.pt.trace.json``):
    ``run.pt.trace.json.gz`` → ``run.1733390000123456789.pt.trace.json.gz``. Kept gzip'd when
    ``--trace`` is."""
    name = trace.name
    gz = name.endswith(".gz")
    stem = name[: -len(".gz")] if gz else name
    for suffix in (".pt.trace.json", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return trace.with_name(f"{stem or 'trace'}.{time_ns}.pt.trace.json{'.gz' if gz else ''}")


def _cpu_wait_ns() -> int | None:
    """The thread's run-queue wait so far (Linux schedstat's second field), None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stats:
            return int(stats.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


class RecorderEvents(msgspec.Struct):
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
        self._hook_handles: list[RemovableHandle] = []
        self._backward_patch: tuple[Any, Any] | None = None
        self._restart_pending = False
        self._marker = StepMarker(self._on_step_end, self._on_restart)
        self._frames: UserFrameTracer | None = None
        self._guard = MemoryGuard(
            settings.max_memory_bytes,
            self._stop_for_memory,
            STOP_PER_HELD_BYTE_WITH_EVENTS if settings.stacks == "all" else STOP_PER_HELD_BYTE,
        )
        self._memory_estimate: int | None = None
        self._last_boundary_ns: int | None = None
        self._last_usage: tuple[int, int | None] = (time.process_time_ns(), _cpu_wait_ns())
        self._window_usage: list[StepUsage] = []
        self._unprofiled_ns: list[int] = []
        self._window_baseline_ns: list[int] = []
        self._after_window_ns: list[int] = []
        self._foreign = ForeignProfilerWatch(self._step_aside)
        self._fetch = FetchOpsPaused(self._records_now, self._traces_with)
        self._kineto_lines = KinetoLinesDropped()
        self._own_calls = 0
        self._discarding = False
        self._stopping = False
        self._done = False
        self._steps_in_window = 0
        self._steps_in_trace = 0
        self._trace_written = False
        self._cycles: list[Path] = []
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
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
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
        self._hook_handles = [
            register_optimizer_step_pre_hook(self._before_optimizer_step),
            register_optimizer_step_post_hook(self._on_optimizer_step),
        ]
        self._listen_to_backward()
        self._kineto_lines.install()
        self._fetch.install()
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
            self._kineto_lines.remove()
            self._fetch.remove()
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
        if not discard and self._will_write_at_stop():
            self.events.say("the script ended; stopping the profiler and writing the trace…")
        self._stop_profilers()
        self._fetch.remove()
        self._kineto_lines.remove()
        self._guard.close()
        return self._result()

    def _will_write_at_stop(self) -> bool:
        """True when stopping now exports a window (the whole run, a window the budget ended, or
        a first partial window)."""
        if self._discarding:
            return False
        if self._startup_profiler is not None:
            return True
        profiler = self._scheduled_profiler
        if profiler is None or not self._records(profiler.current_action):
            return False
        return not (self._stopping and self._trace_written)

    def _stop_profilers(self) -> None:
        # Stopping is not recording: the guard must not count the stop's own growth as a window's.
        self._guard.disarm()
        writes = self._will_write_at_stop()
        for profiler in (self._startup_profiler, self._scheduled_profiler):
            if profiler is None:
                continue
            try:
                with self._own(), self._writing_window() if writes else contextlib.nullcontext():
                    profiler.stop()
            except Exception as error:  # keep what was written; say why the rest is missing
                self._profiler_error = self._profiler_error or f"{type(error).__name__}: {error}"
            _release_results(profiler)
        self._startup_profiler = self._scheduled_profiler = None
        release_freed_memory()

    def _stop_listening(self) -> None:
        deactivate_marker()
        handles, self._hook_handles = self._hook_handles, []
        for handle in handles:
            handle.remove()
        patch, self._backward_patch = self._backward_patch, None
        if patch is not None:
            module, original = patch
            module.backward = original

    def _listen_to_backward(self) -> None:
        """Wrap ``torch.autograd.backward`` (what ``loss.backward()`` calls) to see loops without
        optimizer steps (see :mod:`.steps`)."""
        import torch.autograd

        original = torch.autograd.backward
        marker = self._marker

        def backward(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            marker.backward_ended()
            return result

        backward.__doc__ = original.__doc__
        backward.__wrapped__ = original  # type: ignore[attr-defined]
        self._backward_patch = (torch.autograd, original)
        torch.autograd.backward = backward

    def _result(self) -> CaptureResult:
        return CaptureResult(
            trace=(self._cycles[-1] if self._cycles else self.trace_path) if self._trace_written else None,
            steps_run=self._marker.steps_ended,
            steps_in_trace=self._steps_in_trace,
            # a window stopped for memory stopped counting steps too: it is not the whole run
            whole_run=self._marker.steps_ended == 0 and self._memory_stop != "window",
            cuda=self._cuda,
            export=self._export,
            export_error=self._export_error,
            profiler_error=self._profiler_error,
            memory_stop=self._memory_stop,
            memory_estimate_bytes=self._memory_estimate if self._memory_stop else None,
            peak_rss_bytes=self._guard.peak_bytes,
            foreign_profiler_at=self._foreign.started_at,
            foreign_traces=tuple(path for path in self._foreign.exported if path.is_file()),
            foreign_partial=tuple(sorted(self._foreign.partial)),
            step_usage=tuple(self._window_usage),
            after_window_ns=tuple(self._after_window_ns) if self._trace_written else (),
            cycles=tuple(self._cycles),
        )

    @contextlib.contextmanager
    def _own(self) -> Iterator[None]:
        """Marks our own calls into torch.profiler (the foreign-profiler watch ignores them); a
        DataLoader fetch's paused collection is switched back on first (:mod:`.fetch`)."""
        self._fetch.resume()
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
            # Shapes are what the FLOP count reads (analysis.flops); module frames come from our
            # own tracer. ``with_flops`` is left off: torch 2.13 keeps its counts in Python
            # objects and writes none into the trace (only a top-level ``"with_flops": 1``).
            "record_shapes": scheduled,
            "with_stack": scheduled and self.settings.stacks == "all",
            "profile_memory": self.settings.profile_memory,
            "on_trace_ready": self._on_trace_ready,
        }
        if scheduled:
            options["schedule"] = self._schedule
        for config in _experimental_configs(trace_only=not options["with_stack"]):
            try:
                return profile(**options, experimental_config=config)
            except TypeError:
                continue  # this torch's profiler does not take the option: try the next one
        return profile(**options)

    def _before_optimizer_step(
        self, optimizer: Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._marker.optimizer_step_started()

    def _on_optimizer_step(self, optimizer: Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._marker.optimizer_stepped(id(optimizer))

    def _on_restart(self) -> None:
        """Steps were marked by backward() and an optimizer step came: the next boundary starts the
        schedule over (what was recorded so far is dropped, unless a window was written)."""
        self._restart_pending = True

    def _on_step_end(self) -> None:
        """One step just ended (called by the marker, in the owner process only).

        Runs inside the script's ``optimizer.step()``: a profiler failure must not stop the
        training, so it is kept, profiling stops there, and the end of the run reports it. A move
        that starts a profiler while another one recorded this step waits for ``optimizer.step()``
        to return (see the module doc).
        """
        if self._profiler_error is not None or self._done:
            return
        self._note_step_time()
        if self._starts_after_a_stop():
            frame = _optimizer_step_frame()
            if frame is not None:
                _after_return(frame, self._move_schedule)
                return
        self._move_schedule()

    def _note_step_time(self) -> None:
        """Keep the durations of the steps that ran unprofiled before a window (the start-up step
        excluded), to compare the recorded steps with."""
        now = time.perf_counter_ns()
        last, self._last_boundary_ns = self._last_boundary_ns, now
        (cpu_before, wait_before), usage = self._last_usage, (time.process_time_ns(), _cpu_wait_ns())
        self._last_usage = usage
        profiler = self._scheduled_profiler
        if last is not None and profiler is not None and self._records(profiler.current_action):
            waited = None if usage[1] is None or wait_before is None else usage[1] - wait_before
            if len(self._window_usage) < _USAGE_KEPT:
                self._window_usage.append(StepUsage(now - last, usage[0] - cpu_before, waited, _load_1m()))
        if last is None or profiler is None or self._records(profiler.current_action):
            return
        self._unprofiled_ns = [*self._unprofiled_ns[-(_BASELINE_STEPS - 1) :], now - last]
        if self._trace_written and len(self._after_window_ns) < _BASELINE_STEPS:
            self._after_window_ns.append(now - last)

    def _move_schedule(self) -> None:
        if self._profiler_error is not None or self._done:
            return
        try:
            with self._own():
                self._advance_schedule()
        except Exception as error:
            self._profiler_error = f"{type(error).__name__}: {error}"

    def _starts_after_a_stop(self) -> bool:
        """True when this boundary stops a recording profiler and starts one for the next step."""
        from torch.profiler import ProfilerAction

        profiler = self._scheduled_profiler
        if self._schedule is None:
            return False
        if self._restart_pending:
            return True
        if profiler is None:
            return self._startup_profiler is not None and self._records(self._schedule(1))
        return profiler.current_action == ProfilerAction.RECORD_AND_SAVE and self._records(
            self._schedule(profiler.step_num + 1)
        )

    def _advance_schedule(self) -> None:
        from torch.profiler import ProfilerAction

        if self._restart_pending:
            self._restart_pending = False
            self._drop_scheduled()
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
        if action == ProfilerAction.RECORD:
            estimate = self._guard.next_step_would_pass(self._steps_in_window)
            if estimate is not None:
                self._end_window_for_memory("boundary", estimate)
                return
        if action == ProfilerAction.RECORD_AND_SAVE:
            # This step closes the window: the profiler stops and exports inside step().
            self._stop_frames()
            self._guard.disarm()
            steps = self._steps_in_window
            self.events.say(f"recorded {steps} step{'' if steps == 1 else 's'}; writing the trace…")
            with warnings.catch_warnings(), self._writing_window():
                # Said when a second cycle starts: each window was written when it closed.
                warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
                self._scheduled_profiler.step()
            self._release_written()
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
                self._scheduled_profiler.step()
        self._window_may_have_started()

    def _drop_scheduled(self) -> None:
        """Stop the scheduled profiler without writing what it records (a restart)."""
        profiler, self._scheduled_profiler = self._scheduled_profiler, None
        self._stop_frames()
        self._guard.disarm()
        self._steps_in_window = 0
        self._unprofiled_ns = []
        self._last_boundary_ns = None
        if profiler is None:
            return
        self._discarding = True
        try:
            profiler.stop()
        finally:
            self._discarding = False
            _release_results(profiler)
            release_freed_memory()

    def _release_written(self) -> None:
        """After a window was written inside step(): drop its results, give the heap back."""
        profiler = self._scheduled_profiler
        if profiler is not None and not self._records(profiler.current_action):
            _release_results(profiler)
        release_freed_memory()

    def _window_may_have_started(self) -> None:
        """After a schedule move: when the profiler now records, start the user frames and the watch."""
        profiler = self._scheduled_profiler
        if profiler is None or not self._records(profiler.current_action):
            return
        if self.settings.stacks == "user" and self._frames is None:
            self._frames = UserFrameTracer(self.settings.user_code)
            self._frames.start()
        if not self._guard.armed:  # from the window's start: what the whole window holds
            self._window_baseline_ns, self._unprofiled_ns = self._unprofiled_ns, []
            self._after_window_ns = []
            self._window_usage = []
            self._fetch.used = False
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
            _release_results(startup)
            del startup
            release_freed_memory()

    def _stop_for_memory(self) -> None:
        """The budget is about to be passed inside a step (called on the main thread by the guard)."""
        if self._startup_profiler is not None:
            self._memory_stop = "start-up"
            self._memory_estimate = self._guard.tripped_at_bytes
            with self._own():
                self._drop_startup()
            self.events.say(_START_UP_DROPPED)
            return
        if self._scheduled_profiler is None or self._done:
            return
        self._end_window_for_memory("window", self._guard.tripped_at_bytes)

    def _end_window_for_memory(self, where: str, estimate: int | None) -> None:
        """End the active window now, write it, and record nothing more."""
        self._memory_stop = where
        self._memory_estimate = estimate
        self._done = True
        self._stop_listening()
        self._stop_frames()
        budget = _gib(self.settings.max_memory_bytes)
        if where == "boundary":
            steps = self._steps_in_window
            self.events.say(
                f"recorded {steps} step{'' if steps == 1 else 's'} of the {self.settings.active} asked "
                f"for: one more would pass the memory budget ({budget}, --max-memory); writing the trace…"
            )
        else:
            self.events.say(
                f"recording stopped inside a step: it would pass the memory budget ({budget}, "
                "--max-memory); writing what was recorded…"
            )
        self._stopping = True
        self._stop_profilers()

    def _run_record(self) -> dict[str, Any]:
        """What the trace says of how it was recorded (:data:`.export.RUN_RECORD_KEY`)."""
        record: dict[str, Any] = {
            "stacks": self.settings.stacks,
            "stepMarks": self._marker.source if self._scheduled_profiler is not None else "none",
        }
        if self._fetch.used:
            record["loaderFetch"] = LOADER_FETCH_RANGE_ONLY
        if self._memory_stop == "window":
            record["cutShort"] = True  # the budget stopped the window inside its last step
        baseline = sorted(self._window_baseline_ns)
        if baseline:
            record["unprofiledSteps"] = len(baseline)
            record["unprofiledStepNs"] = baseline[len(baseline) // 2]
            record["unprofiledStepsNs"] = list(self._window_baseline_ns)  # in order: start-up first
        if self._window_usage:  # what lets a diff of traces alone tell a run starved of CPU
            record["stepUsage"] = [
                [usage.wall_ns, usage.cpu_ns, usage.cpu_wait_ns, usage.load_1m]
                for usage in self._window_usage[:STEP_USAGE_KEPT]  # ~40 bytes each
            ]
        return record

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

    def _traces_with(self, hook: object) -> bool:
        """True when ``hook`` is the profile function of the frame tracer now tracing."""
        frames = self._frames
        return frames is not None and frames.is_hook(hook)

    def _records_now(self) -> bool:
        """True while a window of ours records (the start-up one or an active scheduled one)."""
        if self._done or self._stopping or self._profiler_error is not None:
            return False
        if self._startup_profiler is not None:
            return True
        profiler = self._scheduled_profiler
        return profiler is not None and self._records(profiler.current_action)

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
        destination = self.trace_path
        if self.settings.keeps_cycles:
            destination = cycle_path(self.trace_path, time.time_ns())
        try:
            self._export = write_trace(profiler, destination, self._progress, self._run_record())
        except OSError as error:
            self._export_error = f"{error.strerror or error}"
            return
        if self.settings.keeps_cycles:
            self._cycles.append(destination)
        self._trace_written = True
        self._steps_in_trace = steps_in_window
        self.events.written(self._export)


#: Unprofiled steps kept to compare the recorded ones with (the last ones before the window).
_BASELINE_STEPS = 8
#: Steps of a window whose CPU time and load are kept (a result holds at most this many).
_USAGE_KEPT = 10_000


def _gib(size: int) -> str:
    """``2.0 GiB``, or ``150 MiB`` under a GiB."""
    return f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.0f} MiB"


_START_UP_DROPPED = (
    "the start-up recording (step 0) passed the memory budget (--max-memory) and was dropped; "
    "profiling goes on from the first step"
)


def _experimental_configs(*, trace_only: bool) -> Iterator[Any]:
    """Experimental configs to try, best first: CUDA sync events (recorded when a GPU is there) and
    ``trace_only`` (torch builds no Python event objects at the stop; the export does not need them,
    and the stop took 0.33 × what was recorded instead of 0.7 ×), then each alone for older torch."""
    try:
        from torch._C._profiler import _ExperimentalConfig
    except (ImportError, AttributeError):
        return
    tries: list[dict[str, Any]] = [{"enable_cuda_sync_events": True}]
    if trace_only:
        tries.insert(0, {"enable_cuda_sync_events": True, "trace_only": True})
    for options in tries:
        try:
            yield _ExperimentalConfig(**options)
        except TypeError:
            continue


def _release_results(profiler: Any) -> None:
    """Drop what a stopped ``torch.profiler.profile`` keeps of its last window (its results hold
    every event until the next window replaces them)."""
    inner = getattr(profiler, "profiler", None)
    if inner is not None and hasattr(inner, "kineto_results"):
        with contextlib.suppress(Exception):
            inner.kineto_results = None


def _optimizer_step_frame() -> Any:
    """The frame of torch's ``Optimizer.step`` wrapper running now (the one that opened the
    ``Optimizer.step#`` range), or None when the step did not come from there."""
    code = _step_wrapper_code()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return frame
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _step_wrapper_code() -> Any:
    from torch.optim import Optimizer

    wrapper = Optimizer.profile_hook_step(lambda *args, **kwargs: None)
    return getattr(wrapper, "__code__", None)


def _after_return(frame: Any, action: Callable[[], None]) -> None:
    """Run ``action`` when ``frame`` returns, from a profile function (this thread's function, if
    any, goes on receiving every event and is put back first)."""
    previous = sys.getprofile()

    def watch(event_frame: Any, event: Any, arg: object) -> None:
        if previous is not None:
            previous(event_frame, event, arg)
        if event == "return" and event_frame is frame:
            sys.setprofile(previous)
            action()

    sys.setprofile(watch)
