"""A short GitHub-flavoured Markdown summary, for a pull request comment or ``$GITHUB_STEP_SUMMARY``.

The scorecard, where the GPU time goes, the top findings with their source lines and savings; for
``diff``, the before/after table; for a job, the stragglers and the ranks. Bounded: at most ``MAX_CHARS`` characters for any trace.
Every string that comes from the trace is escaped (each ASCII punctuation character backslashed,
so a name can never become a link, an image, HTML or a table cell) and cut; only the advice's code,
ours, is shown as code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from traceinsight.formatting import format_count, format_duration, format_share, source_label
from traceinsight.render import AnyResult, shown_details
from traceinsight.render.facts import header_facts, no_findings_text, saving_text, time_split
from traceinsight.render.scorecard import scorecard
from traceinsight.results import Result
from traceinsight.results.vocabulary import total_usage

if TYPE_CHECKING:  # a job's and a diff's types are made when first used (traceinsight.results)
    from traceinsight.results import Comparison, JobComparison, JobResult

__all__ = ["MAX_CHARS", "MarkdownRenderer", "code_span", "escape"]

#: GitHub truncates comments past 65,536 characters; stay well below.
MAX_CHARS: Final[int] = 60_000
#: Cards shown; the rest are counted.
TOP_FINDINGS: Final[int] = 8
#: Ranks in a job's table (stragglers and the latest first).
MARKDOWN_RANKS: Final[int] = 64
#: A trace string is cut to this many characters.
_MAX_TEXT: Final[int] = 200
#: What Markdown (GitHub's, with autolinks, math, issue references and emoji) can read as markup in a
#: line, and only that, so the summary reads well raw (it escaped every punctuation mark: 167
#: backslashes in 6 KB): code, emphasis, strikethrough, links and images (``[``), HTML and autolinks
#: (``<``), entities (``&``), table cells, math and the escape itself, wherever they stand; ``_``
#: where it can open or close emphasis (at a word's edge: never inside one); what a linkifier takes
#: for an address without any markup (a ``.`` before a letter, as in ``evil.example`` or ``www.``;
#: the ``:`` of ``://``; an ``@``); an issue reference (``#12``) and an emoji's ``:name:``.
#: (``!`` and ``(`` make nothing without ``[``.)
_ACTIVE = re.compile(
    r"[\\`*\[\]<&|~$@]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|\.(?=[A-Za-z])|:(?=//)|#(?=\d)|:(?=[A-Za-z0-9_+-]+:)"
)
#: What starts a block where a text starts an item's line (``- {text}``): a heading, a list, a
#: numbered list (each with a space or nothing after), a rule of dashes, a quote, a setext underline.
_LEADING = re.compile(r"#+(?=\s|$)|[+\-](?=\s|$)|-[-\s]*$|>|=+\s*$|\d+[.)](?=\s|$)")


def escape(text: object, limit: int = _MAX_TEXT) -> str:
    """Text shown as it is: one line, cut to ``limit``, every character Markdown could read as
    markup there escaped (:data:`_ACTIVE`)."""
    value = " ".join(str(text).split())
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    escaped = _ACTIVE.sub(lambda found: "\\" + found.group(), value)
    leading = _LEADING.match(escaped)
    if leading is not None:  # at an item's start it would open a block: escape its first mark
        at = len(leading.group()) - len(leading.group().lstrip("0123456789"))
        escaped = f"{escaped[:at]}\\{escaped[at:]}"
    return escaped


def code_span(text: object, limit: int = 80) -> str:
    """``text`` as an inline code span that nothing in it can close: one line, cut to ``limit``,
    fenced by one more backtick than its longest run (padded where it starts or ends with one), so
    a string from a stored result never becomes a link, an image or HTML."""
    value = " ".join(str(text).split())
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _fence(code: str) -> str:
    """A fenced code block longer than any backtick run in ``code``."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}python\n{code}\n{fence}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class MarkdownRenderer:
    """Renders a result as a short Markdown summary, at most :data:`MAX_CHARS` characters."""

    def render(self, result: AnyResult) -> str:
        """The summary of a trace, a job or a comparison."""
        if not isinstance(result, Result):  # a diff's or a job's: their types load when first used
            from traceinsight.results import Comparison, JobComparison, JobResult

            if isinstance(result, Comparison):
                return _comparison(result)
            if isinstance(result, JobComparison):
                return _job_comparison(result)
            if isinstance(result, JobResult):
                return _job(result)
        return _trace(result)


def _trace(result: Result) -> str:
    """A trace's summary."""
    details = shown_details(result, "the Markdown summary")
    lines: list[str] = [f"## traceinsight: {escape(result.trace.name)}", ""]
    for label, value in header_facts(result):
        lines.append(f"- **{label}**: {escape(value, 300)}")
    lines.append("")
    run = result.run
    if run is not None and (run.failure or run.exit_status):
        lines += [
            f"> **The script failed** (exit status {run.exit_status}): {escape(run.failure or '')}",
            "",
        ]
    for warning in result.warnings:
        lines += [f"> ⚠️ {escape(warning.message, 500)} *What to do:* {escape(warning.advice, 300)}", ">"]
    if result.warnings:
        lines[-1] = ""
    lines += _table(
        ("measure", "value", "verdict"),
        [(escape(s.label), escape(s.value), escape(s.verdict, 300)) for s in scorecard(result)],
    )
    usage = total_usage(details.usage)
    if usage.window_ns:
        per_step = usage.steps > 0
        lines += ["", f"**Where the GPU time goes** ({escape(usage.of_what)})", ""]
        lines += _table(
            ("", "per step" if per_step else "time", "share"),
            [
                (
                    escape(row.label),
                    format_duration(row.per_step_ns if row.per_step_ns is not None else row.ns),
                    format_share(row.share),
                )
                for row in time_split(usage)
            ],
        )
    cards = [finding for finding in result.findings if not finding.minor]
    minor = [finding for finding in result.findings if finding.minor]
    lines.append("")
    if cards:
        lines += [f"### Findings ({len(cards)}), largest saving first", ""]
        for index, finding in enumerate(cards[:TOP_FINDINGS], 1):
            lines.append(f"**{index}. [{finding.severity}] `{finding.rule}`**: {escape(finding.title, 400)}")
            lines.append("")
            if finding.source:
                label = source_label(
                    finding.source, finding.source_kind, finding.source_line_kind, finding.source_function
                )
                lines.append(f"- source: {escape(label)}")
            lines.append(
                f"- saves {escape(saving_text(finding))}"
                + (f": {escape(finding.saving_note, 300)}" if finding.saving_note else "")
            )
            lines.append(f"- do: {escape(finding.advice.summary, 400)}")
            lines += [
                "",
                "<details><summary>before / after</summary>",
                "",
                _fence(finding.advice.before),
                "",
                _fence(finding.advice.after),
                "",
                "</details>",
                "",
            ]
        if len(cards) > TOP_FINDINGS:
            lines += [f"… and {len(cards) - TOP_FINDINGS} more in the HTML report.", ""]
    else:
        lines += [escape(no_findings_text(result), 500), ""]
    if minor:
        lines.append(f"<details><summary>Minor findings ({len(minor)})</summary>\n")
        lines += [f"- `{finding.rule}`: {escape(finding.title, 300)}" for finding in minor[:20]]
        lines += ["", "</details>", ""]
    return _bounded("\n".join(lines))


def _comparison(comparison: Comparison) -> str:
    """The diff as Markdown: notes, the before/after table, findings fixed / new / still present."""
    lines = [f"## traceinsight diff: {escape(comparison.before)} → {escape(comparison.after)}", ""]
    for note in comparison.notes:
        lines.append(f"> ⚠️ Not the same setup: {escape(note, 300)}")
    if comparison.notes:
        lines.append("")
    basis = "per step" if comparison.basis == "per step" else "in all"
    if comparison.headline:
        lines += [f"**{escape(comparison.headline, 500)}**", ""]
        lines += [f"- {escape(line, 300)}" for line in comparison.moved]
        lines += [""] if comparison.moved else []
    judged = any(m.verdict is not None for m in comparison.shown)
    verdict = (f"verdict ({comparison.confidence * 100:.0f}% interval)",) if judged else ()
    lines += _table(
        ("", "before", "after", "change", *verdict),
        [
            (
                escape(m.title),
                m.text(m.before),
                m.text(m.after),
                m.change_text(),
                *((m.verdict_text(),) if judged else ()),
            )
            for m in comparison.shown
        ],
    )
    lines += ["", f"Times are {basis}.", ""]
    if comparison.predictions:
        lines += ["### Predicted and measured (fixed findings)", ""]
        lines += [f"- {code_span(p.rule)}: {escape(p.text(), 400)}" for p in comparison.predictions]
        lines.append("")
    for status, title in (("fixed", "Fixed"), ("new", "New"), ("still", "Still present")):
        changes = [change for change in comparison.findings if change.status == status]
        if not changes:
            continue
        lines += [f"### {title} ({len(changes)})", ""]
        for change in changes[:15]:
            saving = " → ".join(
                format_duration(value * 1000) if value is not None else "—"
                for value in (change.before_saving_us, change.after_saving_us)
            )
            at = "in" if change.shown_site != change.site else "at"  # a function, not the call's line
            lines.append(
                f"- {code_span(change.rule)} {at} {escape(change.shown_site) or 'the trace'}: "
                f"{escape(change.title, 300)} (saving {saving})"
            )
        lines.append("")
    if comparison.kernels:
        lines += [f"### Kernels that changed most ({comparison.basis})", ""]
        lines += _table(
            ("GPU", "kernel", "before", "after", "launches"),
            [
                (
                    str(change.device),
                    escape(change.name, 80),
                    format_duration(change.before_total_us * 1000),
                    format_duration(change.after_total_us * 1000),
                    f"{format_count(change.before_launches)} → {format_count(change.after_launches)}",
                )
                for change in comparison.kernels
            ],
        )
    return _bounded("\n".join(lines) + "\n")


def _job_comparison(comparison: JobComparison) -> str:
    """The diff of two jobs as Markdown: notes, the job before and after, stragglers, the ranks
    that changed most, findings fixed / new / still present."""
    from traceinsight.render.job_diff import (
        FINDING_STATUSES,
        STRAGGLER_STATUSES,
        finding_saving,
        straggler_line,
    )
    from traceinsight.render.job_diff import (
        RANK_COLUMNS as DIFF_RANK_COLUMNS,
    )
    from traceinsight.render.job_diff import (
        rank_cells as diff_rank_cells,
    )

    lines = [
        f"## traceinsight diff of two jobs: {escape(comparison.before)} → {escape(comparison.after)}",
        "",
    ]
    lines += [f"> ⚠️ Not the same setup: {escape(note, 300)}" for note in comparison.notes]
    if comparison.notes:
        lines.append("")
    if comparison.headline:
        lines += [f"**{escape(comparison.headline, 400)}**", ""]
    lines += _table(
        ("the job (per step; the mean rank unless named)", "before", "after", "change"),
        [(escape(m.title), m.text(m.before), m.text(m.after), m.change_text()) for m in comparison.shown],
    )
    lines.append("")
    for status, (title, _) in STRAGGLER_STATUSES.items():
        moved = [change for change in comparison.stragglers if change.status == status]
        if moved:
            lines += [f"### {title} ({len(moved)})", ""]
            lines += [f"- {escape(straggler_line(change), 300)}" for change in moved[:MARKDOWN_RANKS]]
            lines.append("")
    ranks = comparison.changed_ranks
    lines += [
        f"### Ranks (before → after, per steady step; {min(len(ranks), MARKDOWN_RANKS)} of {len(ranks)})",
        "",
    ]
    lines += _table(
        ("rank", *(name for _, name in DIFF_RANK_COLUMNS), "step change"),
        [tuple(escape(cell, 120) for cell in diff_rank_cells(change)) for change in ranks[:MARKDOWN_RANKS]],
    )
    lines.append("")
    for status, (title, _) in FINDING_STATUSES.items():
        changes = [change for change in comparison.findings if change.status == status]
        if not changes:
            continue
        lines += [f"### {title} ({len(changes)}; saving per step, the median rank's)", ""]
        for change in changes[:20]:
            minor = " (minor)" if change.minor else ""
            lines.append(
                f"- {code_span(change.rule)}: {escape(change.title, 300)}{minor} (saving {finding_saving(change)})"
            )
        lines.append("")
    return _bounded("\n".join(lines) + "\n")


def _job(job: JobResult) -> str:
    """The job as GitHub Markdown, bounded like the one-trace summary (:data:`~.markdown.MAX_CHARS`)."""
    from traceinsight.render.job_text import (
        RANK_COLUMNS,
        job_headline,
        job_saving,
        rank_cells,
        ranks_in_order,
        straggler_lines,
    )

    lines = [f"## traceinsight job: {escape(job_headline(job), 300)}", ""]
    lines += [f"> **warning:** {escape(warning, 400)}" for warning in job.warnings]
    lines.append("")
    if not job.cycles:
        lines.append(f"### Stragglers ({len(job.stragglers)})")
    if not job.stragglers and not job.cycles:
        lines.append(
            "No rank keeps the others waiting, and no rank's collectives or step time stand out from the others."
        )
    for _, headline, details in straggler_lines(job):
        lines.append(f"- **{escape(headline, 300)}**")
        lines += [f"  - {escape(detail, 300)}" for detail in details]
    unit = "cycle" if job.cycles else "rank"
    lines += ["", f"### {unit.capitalize()}s (per steady step)", ""]
    ordered = ranks_in_order(job)
    cell: Callable[[str], str] = lambda text: escape(text, 120)  # noqa: E731
    rows = [tuple(cell(value) for value in rank_cells(result)) for result in ordered[:MARKDOWN_RANKS]]
    lines += _table((unit, *RANK_COLUMNS[1:]), rows)
    if len(ordered) > MARKDOWN_RANKS:
        lines.append(f"\n… {len(ordered) - MARKDOWN_RANKS} more {unit}s in the JSON and HTML report")
    if job.findings:
        lines += ["", f"### Findings across {unit}s", ""]
        lines += _table(
            ("rule", f"{unit}s", "severity", "saving per step", "finding"),
            [
                (escape(f.rule), f"{len(f.ranks)} of {len(job.ranks)}", f.severity,
                 job_saving(job, f), escape(f.title) + (f" ({escape(f.note)})" if f.note else "")
                 + (" (minor)" if f.minor else ""))
                for f in job.findings[:20]
            ],
        )  # fmt: skip
    return _bounded("\n".join(lines) + "\n")


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[: MAX_CHARS - 80].rsplit("\n", 1)[0] + "\n\n… (cut to stay under GitHub's comment limit)\n"
