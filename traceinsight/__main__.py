"""The `traceinsight` command's entry point; `python -m traceinsight` is the same command.

The CLI's imports (typer, rich) take about half a second: Ctrl-C in that time is one line and exit
status 130, like Ctrl-C at any later point before a script runs, never a traceback.

polars' allocator (jemalloc, built with a 500 ms decay of dirty pages and 1 s of muzzy ones)
keeps freed pages resident that long, so each stage of an analysis adds the last one's garbage to
the peak memory. The command asks it to give them back after 100 ms, from a thread of its own: on a
0.5 GB DDP trace the peak falls from 532 to 463 MiB (below the file's size) for about 4 % more
wall time (medians of 5 paired runs). The setting is read once, when polars loads, and
is taken out of the environment again, so a script under `traceinsight run` never sees it; a
value the user set is kept as it is. The same holds for numpy's BLAS threads (one is enough).
"""

from __future__ import annotations

import gc
import os
import sys

from traceinsight.collector import collector_paused

#: jemalloc's options for polars (its builds prefix the variable with ``_RJEM_``).
ALLOCATOR_VARIABLE = "_RJEM_MALLOC_CONF"
ALLOCATOR_OPTIONS = "background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"
#: numpy's OpenBLAS starts a thread per core that spins after each call; nothing here multiplies
#: matrices, and on two cores the spinning took ~1 % of the time from the scanner.
BLAS_VARIABLE = "OPENBLAS_NUM_THREADS"
#: What the command sets while its libraries load, unless the user set it.
LOAD_SETTINGS = {ALLOCATOR_VARIABLE: ALLOCATOR_OPTIONS, BLAS_VARIABLE: "1"}


def main() -> None:
    """Import the CLI and run it."""
    ours = [name for name in LOAD_SETTINGS if name not in os.environ]
    for name in ours:
        os.environ[name] = LOAD_SETTINGS[name]
    try:
        with collector_paused():  # the imports make next to no garbage (traceinsight.collector)
            from traceinsight.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("traceinsight: interrupted (Ctrl-C) while starting; nothing was run or written\n")
        sys.stderr.flush()
        # Not SystemExit: an import cut short by the interrupt can leave the interpreter to end
        # itself by SIGINT on the way out (seen 1 run in 12). Nothing ran, so nothing to tear down.
        os._exit(130)
    finally:
        for name in ours:
            os.environ.pop(name, None)
    # What the imports made lives to the end: the cyclic collector need not walk it again each
    # time an analysis makes objects (it took ~1 % of a run). Once, here, not in the library.
    gc.freeze()
    cli_main()


if __name__ == "__main__":
    main()
