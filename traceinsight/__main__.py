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


def main() -> None:
    """Import the commands and run them."""
    try:
        # inside: process.py's own imports (concurrent.futures, logging) are part of the start-up
        from traceinsight.process import collector_paused

        with collector_paused():
            from traceinsight.commands import main as commands_main
    except KeyboardInterrupt:
        sys.stderr.write("traceinsight: interrupted (Ctrl-C) while starting; nothing was run or written\n")
        sys.stderr.flush()
        # Not SystemExit: an import cut short by the interrupt can leave the interpreter to end
        # itself by SIGINT on the way out (seen 1 run in 12). Nothing ran, so nothing to tear down.
        os._exit(130)
    commands_main()


if __name__ == "__main__":
    main()
