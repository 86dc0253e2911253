"""The `traceinsight` command's entry point; `python -m traceinsight` is the same command.

The command's own imports (typer, rich) take about a fifth of a second, with the cyclic collector
paused (they make next to no garbage: :func:`traceinsight.process.collector_paused`): Ctrl-C in
that time is one line and exit status 130, like Ctrl-C at any later point before a script runs,
never a traceback. Everything else a command needs it loads when it runs
(:func:`traceinsight.process.libraries_loading`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: nothing slow before _begin() can take Ctrl-C as one line
if TYPE_CHECKING:
    from typing import Any


def main() -> None:
    """Import the commands and run them (`run`'s script in this frame: the console script's entry)."""
    staged, ready = _begin()
    outcome = None
    if ready is not None:
        # `run`'s script runs in this frame: every frame above it costs a script that walks its
        # stack (see traceinsight.capture.script); its errors end it as Python would.
        try:
            if ready.code is not None:
                exec(ready.code, ready.namespace)
            elif ready.call is not None:
                ready.call()
        except BaseException as error:
            outcome = _outcome(error)
        else:
            outcome = _outcome(None)
    _end(staged, outcome)


def _begin() -> tuple[Any, Any]:
    """The command parsed and, for `run`, the script ready to run (None for any other command,
    which ends the process in there)."""
    try:
        # inside: process.py's own imports (concurrent.futures, logging) are part of the start-up
        from traceinsight.process import collector_paused

        with collector_paused():
            from traceinsight.commands import begin_script, start_main
    except KeyboardInterrupt:
        sys.stderr.write("traceinsight: interrupted (Ctrl-C) while starting; nothing was run or written\n")
        sys.stderr.flush()
        # Not SystemExit: an import cut short by the interrupt can leave the interpreter to end
        # itself by SIGINT on the way out (seen 1 run in 12). Nothing ran, so nothing to tear down.
        os._exit(130)
    staged = start_main()  # any other command than `run` ends the process in there
    return staged, begin_script(staged)


def _outcome(error: BaseException | None) -> Any:
    from traceinsight.capture.script import ScriptOutcome, outcome_of

    return ScriptOutcome(exit_status=0) if error is None else outcome_of(error)


def _end(staged: Any, outcome: Any) -> None:
    from traceinsight.commands import end_script

    end_script(staged, outcome)


if __name__ == "__main__":
    # `python -m traceinsight`: the script runs in this module's frame, not in main()'s (one frame
    # fewer above it; runpy's two are above this one). The same steps as main().
    _staged, _ready = _begin()
    _result = None
    if _ready is not None:
        try:
            if _ready.code is not None:
                exec(_ready.code, _ready.namespace)
            elif _ready.call is not None:
                _ready.call()
        except BaseException as _error:
            _result = _outcome(_error)
        else:
            _result = _outcome(None)
    _end(_staged, _result)
