"""`python -m traceinsight` is the same as the `traceinsight` command."""

from traceinsight.cli import main

if __name__ == "__main__":
    main()
