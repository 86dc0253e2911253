"""Where one training step ends and the next begins, without touching the user's loop.

`traceinsight run` drives the profiler schedule from step boundaries. They come from two sources:

- every ``optimizer.step()`` of a ``torch.optim`` optimizer (a global post-hook calls
  :meth:`StepMarker.optimizer_stepped`); with several optimizers, :class:`OptimizerCycle` turns
  their calls into one boundary per iteration;
- the public API, :func:`step` and :func:`profile_step`, for loops without ``torch.optim``. Once a
  script uses it, optimizer steps no longer mark anything, so a step is never counted twice;
- in a loop that neither calls ``optimizer.step()`` nor :func:`step` (manual SGD, a language model
  updating its weights by hand), the end of every ``backward()`` from the second one on
  (:data:`BACKWARDS_BEFORE_MARKING`), outside an optimizer's step (an LBFGS closure's backward is
  not an iteration). When an optimizer step comes after all (gradient accumulation: several
  backwards per step), steps are counted again from it, by the optimizer (``restart``).

Nothing here imports torch: the API is a no-op when the script is not run by `traceinsight run`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["BACKWARDS_BEFORE_MARKING", "OptimizerCycle", "StepMarker", "profile_step", "step"]

BACKWARDS_BEFORE_MARKING = 2
"""``backward()`` calls without an optimizer step before backward calls mark steps."""


class OptimizerCycle:
    """Learns which optimizer closes an iteration and reports one boundary per iteration.

    Algorithm: the first optimizer that steps is assumed to be alone, so a single-optimizer loop
    gets a boundary after every ``step()`` from the very first one. When an optimizer not seen
    before steps, it joins the cycle and becomes the *closing* optimizer (the last one to step in
    an iteration); a boundary is reported only when the closing optimizer steps. With ``A, B`` per
    iteration the calls ``A B A B A B`` give boundaries after ``A``, ``B``, ``B``: the first two
    steps are irregular while the cycle is learnt (they fall in the schedule's start-up steps),
    and every later step is exactly one iteration. An optimizer that steps several times per
    iteration before the closing one (``D D G`` in a WGAN) is absorbed the same way.
    """

    def __init__(self) -> None:
        self._members: set[int] = set()
        self._closing: int | None = None

    def ends_step(self, optimizer_id: int) -> bool:
        """Record that the optimizer with ``optimizer_id`` stepped; return True if a step ends here."""
        if self._closing is None or optimizer_id == self._closing:
            self._closing = optimizer_id
            self._members.add(optimizer_id)
            return True
        if optimizer_id not in self._members:
            self._members.add(optimizer_id)
            self._closing = optimizer_id
        return False


class StepMarker:
    """Turns optimizer steps and explicit marks into step ends, reported once each to ``end_step``.

    Only the process that created the marker reports anything: a forked DataLoader worker inherits
    the marker but its calls are ignored (the pid differs).
    """

    def __init__(self, end_step: Callable[[], None], restart: Callable[[], None] | None = None) -> None:
        self._end_step = end_step
        self._restart = restart
        self._owner_pid = os.getpid()
        self._cycle = OptimizerCycle()
        self._explicit = False
        self._optimizer_seen = False
        self._in_optimizer_step = False
        self._backwards = 0
        self._by_backward = False
        self.steps_ended = 0
        """How many steps have ended so far (the number of boundaries reported)."""

    @property
    def source(self) -> str:
        """What marks steps: ``explicit`` (:func:`step`), ``optimizer``, ``backward``, or ``none`` yet."""
        if self._explicit:
            return "explicit"
        if self._by_backward:
            return "backward"
        return "optimizer" if self.steps_ended else "none"

    def optimizer_step_started(self) -> None:
        """Called before every ``optimizer.step()``: backward calls inside it are not iterations."""
        if os.getpid() == self._owner_pid:
            self._optimizer_seen = True
            self._in_optimizer_step = True

    def optimizer_stepped(self, optimizer_id: int) -> None:
        """Called after every ``optimizer.step()``; ends a step when the iteration's cycle closes."""
        if os.getpid() != self._owner_pid or self._explicit:
            return
        self._in_optimizer_step = False
        self._optimizer_seen = True
        if self._by_backward:
            # Steps were marked by backward() until now: count again, by the optimizer.
            self._by_backward = False
            self._cycle = OptimizerCycle()
            self.steps_ended = 0
            if self._restart is not None:
                self._restart()
        if self._cycle.ends_step(optimizer_id):
            self._report_step_end()

    def backward_ended(self) -> None:
        """Called after every ``torch.autograd.backward`` (``loss.backward()``): in a loop without
        optimizer steps or explicit marks, ends a step from the second call on."""
        if os.getpid() != self._owner_pid or self._explicit or self._optimizer_seen:
            return
        if self._in_optimizer_step:
            return
        self._backwards += 1
        if self._backwards >= BACKWARDS_BEFORE_MARKING:
            self._by_backward = True
            self._report_step_end()

    def explicit_step(self) -> None:
        """Called by :func:`step`: ends a step now, and from now on ignore optimizer steps."""
        if os.getpid() != self._owner_pid:
            return
        self._explicit = True
        self._report_step_end()

    def _report_step_end(self) -> None:
        self.steps_ended += 1
        self._end_step()


_active_marker: StepMarker | None = None


def activate_marker(marker: StepMarker) -> None:
    """Make ``marker`` receive :func:`step` calls (done by `traceinsight run` before the script)."""
    global _active_marker
    _active_marker = marker


def deactivate_marker() -> None:
    """Turn :func:`step` back into a no-op (done by `traceinsight run` after the script)."""
    global _active_marker
    _active_marker = None


def step() -> None:
    """Mark the end of one training step (one iteration of your loop).

    Only needed for loops that do not call ``optimizer.step()`` of a ``torch.optim`` optimizer:
    those are marked automatically. Does nothing unless the script runs under `traceinsight run`,
    so it can stay in the code::

        for batch in loader:
            train_one_batch(batch)
            traceinsight.step()
    """
    marker = _active_marker
    if marker is not None:
        marker.explicit_step()


@contextmanager
def profile_step() -> Iterator[None]:
    """Context manager form of :func:`step`: the step ends when the block exits.

    ::

        for batch in loader:
            with traceinsight.profile_step():
                train_one_batch(batch)
    """
    try:
        yield
    finally:
        step()
