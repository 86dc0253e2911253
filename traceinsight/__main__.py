"""The `traceinsight` command's entry point; `python -m traceinsight` is the same command.

The CLI's imports (typer, rich) take about half a second: Ctrl-C in that time is one line and exit
status 130, like Ctrl-C at any later point before a script runs, never a traceback.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Import the CLI and run it."""
    try:
        from traceinsight.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("traceinsight: interrupted (Ctrl-C) while starting; nothing was run or written\n")
        sys.stderr.flush()
        # Not SystemExit: an import cut short by the interrupt can leave the interpreter to end
        # itself by SIGINT on the way out (seen 1 run in 12). Nothing ran, so nothing to tear down.
        os._exit(130)
    cli_main()


if __name__ == "__main__":
    main()
