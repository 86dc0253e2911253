"""The options the commands share, each spelled once, and what a command makes of them.

An option is an ``Annotated`` type here (its flag, metavar and help); a command's signature names
it. What `analyze` and `diff` read alike (the project table, the outputs asked for, the gate's
budgets, how traces are read) is gathered once, by :func:`settings`.

Nothing here imports polars or the analyses: ``--help`` of every command stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from traceinsight.config import ProjectConfig, SourceRoot, read_config
from traceinsight.config import source_root as resolve_source_root
from traceinsight.errors import ConfigError
from traceinsight.load.limits import parse_size as size_of
from traceinsight.load.source import SizeLimit
from traceinsight.model import Model, field, fields_of
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.results.gate import Budgets

__all__ = [
    "EXIT_CODES",
    "STDOUT",
    "FailOnOption",
    "FailOnRuleOption",
    "ForceOption",
    "JsonOption",
    "LowUseOption",
    "MarkdownOption",
    "MaxIdleOption",
    "MaxSizeOption",
    "MaxSyncsOption",
    "MinGapOption",
    "NoHtmlOption",
    "Reading",
    "Settings",
    "UserCodeOption",
    "Wanted",
    "one_on_stdout",
    "parse_size",
    "settings",
]

DEFAULTS: Final = Thresholds()

#: Every command's epilog: what its exit status means.
EXIT_CODES: Final = """\b
Exit status: 0 done; 1 a gate was broken (one line per broken budget on stderr);
2 bad input (an unreadable or invalid trace, a bad option or project setting);
3 an internal error (please report it)."""

#: An output given as this goes to stdout (``-o -``, ``--json -``, ``--markdown -``).
STDOUT: Final = "-"

JsonOption = Annotated[
    str | None,
    typer.Option("--json", metavar="PATH|-", help="Also write the result as JSON to PATH ('-': stdout).",
                 show_default=False),
]  # fmt: skip
MarkdownOption = Annotated[
    str | None,
    typer.Option("--markdown", metavar="PATH|-", show_default=False,
                 help="Also write a short GitHub Markdown summary (a PR comment, $GITHUB_STEP_SUMMARY) to PATH "
                 "('-': stdout)."),
]  # fmt: skip
NoHtmlOption = Annotated[bool, typer.Option("--no-html", help="Do not write the HTML page.")]
MinGapOption = Annotated[
    float,
    typer.Option(
        "--min-gap-us", metavar="US", min=0, help="Shortest GPU idle stretch reported as a gap, in µs."
    ),
]
LowUseOption = Annotated[
    float,
    typer.Option("--low-utilization", metavar="SHARE", min=0, max=1,
                 help="GPU compute share (0-1) below which low-gpu-utilization fires."),
]  # fmt: skip
UserCodeOption = Annotated[
    list[str] | None,
    typer.Option("--user-code", metavar="PACKAGE", show_default=False,
                 help="A package whose frames are your own code, for source lines (repeatable; also "
                 "user-code in [tool.traceinsight])."),
]  # fmt: skip
ForceOption = Annotated[
    bool,
    typer.Option("--force", help="Let an output replace a file that is not traceinsight's, and read a gzip trace "
                 "that expands more than 100 times (real traces expand at most about 45 times)."),
]  # fmt: skip
MaxSizeOption = Annotated[
    str | None,
    typer.Option("--max-size", metavar="SIZE", show_default=False,
                 help="Refuse traces holding more JSON than SIZE (e.g. 8G; k, M, G, T are powers of 1024) "
                 "[default: no limit for traces, 16 MiB for a stored result; a gzip that expands more than 100 times is refused anyway]."),
]  # fmt: skip
FailOnOption = Annotated[
    str | None,
    typer.Option("--fail-on", metavar="SEVERITY", show_default=False,
                 help="Gate: exit 1 when a finding of SEVERITY or worse is found (high, medium or low)."),
]  # fmt: skip
FailOnRuleOption = Annotated[
    list[str] | None,
    typer.Option("--fail-on-rule", metavar="RULE", show_default=False,
                 help="Gate: exit 1 when a finding of rule RULE is found (repeatable; ids in the README)."),
]  # fmt: skip
MaxIdleOption = Annotated[
    float | None,
    typer.Option("--max-idle", metavar="PCT", min=0, show_default=False,
                 help="Gate: exit 1 when the GPU is idle more than PCT % of the step time."),
]  # fmt: skip
MaxSyncsOption = Annotated[
    float | None,
    typer.Option("--max-syncs-per-step", metavar="N", min=0, show_default=False,
                 help="Gate: exit 1 when the host waits on the GPU more than N times per step."),
]  # fmt: skip


def parse_size(text: str, option: str = "--max-size") -> int:
    """``512M``, ``2G``, ``1.5GB``, ``8GiB``, ``4096`` → bytes (:func:`traceinsight.load.limits.parse_size`:
    k, M, G, T are powers of 1024), or one line naming ``option``."""
    try:
        return size_of(text)
    except ValueError:
        raise ConfigError(
            f"{option} {text!r} is not a size; give e.g. 512M, 2G or a number of bytes "
            "(k, M, G, T: powers of 1024)"
        ) from None


class Wanted(Model, frozen=True):
    """The outputs a command was asked for."""

    #: ``-o``: the page's path, :data:`STDOUT` (``-o -``), None for the command's default name;
    #: not written unless ``write_html``.
    html: Path | str | None = None
    #: ``--json``: a path, ``-`` for stdout, or None.
    json: str | None = None
    #: ``--markdown``: a path, ``-`` for stdout, or None.
    markdown: str | None = None
    write_html: bool = True
    #: ``--force``: an output may replace a file that is not ours.
    force: bool = False

    def page(self, default: Path) -> Path | str | None:
        """Where the page goes: ``default`` unless ``-o`` said, :data:`STDOUT` for ``-o -``, or
        None when it is not written."""
        if not self.write_html:
            return None
        if self.html is None:
            return default
        return STDOUT if self.html == STDOUT else Path(self.html)


class Reading(Model, frozen=True):
    """How traces are read and judged."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    #: Packages whose frames are the user's own code.
    user_code: tuple[str, ...] = ()
    #: ``--max-size`` and ``--force``'s gzip ratio.
    limit: SizeLimit = field(default_factory=SizeLimit)

    @property
    def threshold_values(self) -> dict[str, Any]:
        """The thresholds by name, as the public API takes them (:func:`traceinsight.api.analyze`)."""
        return {item.name: getattr(self.thresholds, item.name) for item in fields_of(self.thresholds)}


class Settings(Model, frozen=True):
    """What `analyze` and `diff` read alike from their options and the project table."""

    config: ProjectConfig
    wanted: Wanted
    reading: Reading
    budgets: Budgets

    def source_root(self, given: Path | None, traces: Sequence[Path] = ()) -> SourceRoot | None:
        """Where code excerpts may be read from: ``--source-root``, else the project table's when
        its file is in the working folder or a trace's own (a folder given as a job: itself)."""
        folders = [trace if trace.is_dir() else trace.absolute().parent for trace in traces]
        return resolve_source_root(given, self.config, folders)


def one_on_stdout(*, page: str | None, json_out: str | None, markdown: str | None) -> None:
    """At most one of the outputs may be ``-`` (stdout): two documents there could not be told apart."""
    given = (("-o", page), ("--json", json_out), ("--markdown", markdown))
    asked = [f"{option} -" for option, value in given if value == STDOUT]
    if len(asked) == 2:
        raise ConfigError(f"{asked[0]} and {asked[1]} both ask for stdout; write one of them to a file")
    if len(asked) > 2:
        raise ConfigError(
            f"{', '.join(asked[:-1])} and {asked[-1]} all ask for stdout; write all but one to files"
        )


def settings(
    *,
    output: str | None,
    json_out: str | None,
    markdown: str | None,
    no_html: bool,
    force: bool,
    user_code: list[str] | None,
    max_size: str | None,
    min_gap_us: float,
    low_utilization: float,
    fail_on: str | None,
    fail_on_rules: list[str] | None,
    max_idle: float | None,
    max_syncs_per_step: float | None,
    max_regression: float | None = None,
) -> Settings:
    """Read the project table and check the options `analyze` and `diff` take (the command line wins)."""
    # The gate's and the rules' words load the analyses and polars (~0.8 s): read once the
    # command runs, never for --help.
    from traceinsight.results.gate import Budgets, budgets_from_table
    from traceinsight.rules.findings import SEVERITIES
    from traceinsight.rules.ids import check_budget, check_rule_ids

    config = read_config()
    if fail_on is not None and fail_on not in SEVERITIES:
        raise ConfigError(f"--fail-on {fail_on!r}: give one of {', '.join(SEVERITIES)}")
    one_on_stdout(page=None if no_html else output, json_out=json_out, markdown=markdown)
    given = Budgets(
        fail_on=fail_on,
        fail_on_rules=check_rule_ids(fail_on_rules or (), "--fail-on-rule"),
        max_idle=check_budget(max_idle, "--max-idle"),
        max_syncs_per_step=check_budget(max_syncs_per_step, "--max-syncs-per-step"),
        max_regression=check_budget(max_regression, "--max-regression"),
    )
    return Settings(
        config=config,
        wanted=Wanted(html=output, json=json_out, markdown=markdown, write_html=not no_html, force=force),
        reading=Reading(
            thresholds=Thresholds(min_gap_us=min_gap_us, low_utilization=low_utilization),
            user_code=tuple(dict.fromkeys([*(user_code or ()), *config.user_code])),
            limit=SizeLimit(parse_size(max_size) if max_size is not None else None, force=force),
        ),
        budgets=budgets_from_table(config.table, str(config.path)).over(given),
    )
