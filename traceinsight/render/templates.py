"""The pages' templates (``templates/``, shipped in the wheel as ``traceinsight/templates``) and
the one jinja2 environment every page is rendered with: autoescape on, so every name taken from a
trace is escaped; undefined names are errors."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import markupsafe

from traceinsight.errors import TraceInsightError
from traceinsight.formatting import (
    format_count,
    format_duration,
    format_share,
    format_size,
    short_kernel_name,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["TemplatesMissing", "environment", "precompile", "prepare", "templates_dir"]


class TemplatesMissing(TraceInsightError):
    """The report templates are neither in the installed package nor in the source checkout."""


def templates_dir() -> Traversable:
    """Where the report templates are: inside the installed wheel, else ``<checkout>/templates``."""
    packaged = importlib.resources.files("traceinsight") / "templates"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if checkout.is_dir():
        return checkout
    raise TemplatesMissing(
        f"cannot find the report templates (looked in {packaged} and {checkout}); "
        "reinstall torch-traceinsight."
    )


#: What begins each kept file, before the SHA-256 of the compiled code that follows it.
_KEPT_TAG = b"traceinsight-jinja-1\x00"
#: The largest kept file read back (the page's templates compile to ~0.2 MB).
_KEPT_MOST_BYTES = 16 << 20


def _beside_code() -> Path:
    """Where Python keeps this module's compiled code, so the templates' go there too: its
    ``__pycache__``, or the same folder under ``PYTHONPYCACHEPREFIX`` (``sys.pycache_prefix``)."""
    here = Path(__file__).resolve().parent
    if sys.pycache_prefix:
        return Path(sys.pycache_prefix) / here.relative_to(here.anchor)
    return here / "__pycache__"


class _CompiledBeside(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept as Python keeps compiled modules: in this package's ``__pycache__``
    (under ``PYTHONPYCACHEPREFIX`` when it is set) where it can be written (not under ``python -B``
    or ``PYTHONDONTWRITEBYTECODE``, unless :func:`precompile` asks, as ``compileall`` does), each
    checked against its template's text and the Python version (a changed template is compiled
    again) and against a SHA-256 of the compiled code written with it: a damaged file is compiled
    again, never unmarshalled. Written to a file of its own (never through a link) and moved into
    place; read without following a link; silently not kept where the folder cannot be written.
    Compiling the report page's templates took 0.1 s of CPU in each run; reading them back takes
    ~2 ms."""

    def __init__(self, folder: Path | None = None) -> None:
        super().__init__(str(folder if folder is not None else _beside_code()), "templates.%s.jinja")
        self.always = False

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            descriptor = os.open(self._get_cache_filename(bucket), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return
        try:
            with os.fdopen(descriptor, "rb") as kept:
                data = kept.read(_KEPT_MOST_BYTES + 1)
        except OSError:
            return
        head = len(_KEPT_TAG) + 32
        payload = data[head:]
        if (
            len(data) > _KEPT_MOST_BYTES
            or not data.startswith(_KEPT_TAG)
            or hashlib.sha256(payload).digest() != data[len(_KEPT_TAG) : head]
        ):
            return  # damaged, or not ours: compiled again (and written anew)
        try:
            bucket.bytecode_from_string(payload)
        except Exception:  # another jinja2's or Python's code: compiled again
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if sys.dont_write_bytecode and not self.always:
            return
        payload = bucket.bytecode_to_string()
        final = self._get_cache_filename(bucket)
        scratch = f"{final}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        # the mode of the code beside it, as a .pyc has its module's (not a temporary's 0600)
        mode = (os.stat(__file__).st_mode & 0o777) | 0o200
        with contextlib.suppress(OSError):  # a read-only install: compiled in each run, as before
            os.makedirs(self.directory, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            descriptor = os.open(scratch, flags, 0o600)
            try:
                with os.fdopen(descriptor, "wb") as kept:
                    kept.write(_KEPT_TAG + hashlib.sha256(payload).digest() + payload)
                    if hasattr(os, "fchmod"):
                        os.fchmod(kept.fileno(), mode)
                os.replace(scratch, final)  # replaces a link there, never writes through it
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(scratch)


def code_spans(text: object) -> markupsafe.Markup:
    r"""``text`` escaped, each part between backticks set as code (``\`x.item()\``` → ``<code>``):
    the advice and warnings are written with Markdown's backticks, which the page showed raw. Text
    with an odd number of backticks is shown as written."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:
        return markupsafe.escape(text)
    return markupsafe.Markup("").join(
        markupsafe.Markup("<code>{}</code>").format(part) if index % 2 else markupsafe.escape(part)
        for index, part in enumerate(parts)
    )


@functools.cache
def environment() -> jinja2.Environment:
    """The pages' jinja2 environment, made once per process: it keeps each template compiled."""
    root = templates_dir()

    def load(name: str) -> str:
        return (root / name).read_text(encoding="utf-8")

    made = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        bytecode_cache=_CompiledBeside(),
    )
    made.filters.update(
        duration=format_duration,
        size=format_size,
        pct=format_share,
        count=lambda value: f"{value:,}",
        launches=format_count,
        kernel_short=short_kernel_name,
        ticks=code_spans,
    )
    return made


def prepare() -> None:
    """Compile (or read back compiled, ~2 ms) the report page's templates ahead of use (0.1 s of
    CPU): a command does this beside the analysis (:func:`traceinsight.process.prepare_beside`).
    The templates it extends, imports and includes are compiled too (else the page compiles them)."""
    made = environment()
    for name in ("report.html", "base.html", "_macros.html", "_cards.html", "report.css"):
        made.get_template(name)


def precompile() -> None:
    """Compile every page template into the cache beside the code, as ``compileall`` compiles the
    modules (even under ``PYTHONDONTWRITEBYTECODE``): what an install's first run leaves."""
    made = environment.__wrapped__()
    cache = made.bytecode_cache
    assert isinstance(cache, _CompiledBeside)
    cache.always = True
    for template in sorted(entry.name for entry in templates_dir().iterdir() if entry.is_file()):
        made.get_template(template)
