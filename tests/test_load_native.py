"""The native loader (C scanner + column-wise tables) equals the plain reference loader.

Real samples, the same samples cut into tiny blocks (so events straddle every kind of boundary),
and seeded random traces that put every JSON value type, escape and number form into every field
the loader reads. What Python's json reads beyond JSON (NaN, escaped keys, integers beyond int64,
elements that are not objects) the scanner reads the same way; invalid JSON is one line.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracebuild import assert_same_trace

from traceinsight.errors import TraceFormatError
from traceinsight.load import Trace, limits, load_trace, load_trace_reference, native, scanner, schema
from traceinsight.load import tables as load_tables
from traceinsight.load.source import open_trace
from traceinsight.load.tables import trace_for

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
ALL_SAMPLES = sorted(SAMPLES.rglob("*.json*"))

needs_native = pytest.mark.skipif(
    not native.AVAILABLE and not os.environ.get("CI"), reason="the C scanner was not built here"
)


def test_the_scanner_is_built_on_ci() -> None:
    """CI compiles the scanner (gcc is there); a silent fallback to pure Python would hide a break."""
    if os.environ.get("CI"):
        assert native.AVAILABLE, "CI is set but traceinsight.load._scan was not built"


def _native(path: Path) -> Trace:
    with open_trace(path) as source:
        document, part = native.load_native(source, None)
    return trace_for(path, document, part)


@needs_native
@pytest.mark.parametrize("path", ALL_SAMPLES, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_native_path_reads_every_sample_like_the_reference(path: Path) -> None:
    assert_same_trace(_native(path), load_trace_reference(path))


@needs_native
@pytest.mark.parametrize("block", [5, 1 << 16])
@pytest.mark.parametrize(
    "name",
    [
        "a100_recsys_rank0.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
        "h100_bert_small_stacks.json.gz",
    ],
)
def test_tiny_blocks_split_events_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, block: int
) -> None:
    path = SAMPLES / name
    if block < 64:  # byte-sized blocks: only the first 30 kB of events, to keep the test quick
        text = gzip.decompress(path.read_bytes())
        cut = text.find(b"},", 30_000)
        path = tmp_path / "head.json"
        path.write_bytes(text[: cut + 1] + b"]}")
    monkeypatch.setattr(native, "BLOCK_BYTES", block)
    assert_same_trace(_native(path), load_trace_reference(path))


@needs_native
def test_small_blocks_still_give_one_chunk_per_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each table is one contiguous chunk however many blocks it was read in: polars' sorts by several
    columns grow with the number of chunks, which grows with the file (issue 34: 60 chunks at 2 GB);
    blocks without events (which share one empty table dict) leave that dict whole."""
    path = SAMPLES / "v100_ddp_ns_timestamps.pt.trace.json.gz"
    monkeypatch.setattr(native, "BLOCK_BYTES", 1 << 16)  # ~300 blocks
    trace = _native(path)
    tables = {name: getattr(trace, name) for name in ("gpu", "runtime", "cpu_ops", "annotations")}
    assert min(table.height for table in tables.values()) > 20  # rows from many blocks
    assert {name: table.n_chunks() for name, table in tables.items()} == dict.fromkeys(tables, 1)
    assert set(load_tables._EMPTY_TABLES) == set(schema.TABLES)
    assert all(table.is_empty() for table in load_tables._EMPTY_TABLES.values())


# ----------------------------------------------------------------------------- random traces --

_CATEGORIES = [
    "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation",
    "gpu_user_annotation", "python_function", "cuda_sync", "Kernel", "Memcpy", "Runtime", "Operator",
    "fwdbwd", "ac2g", "Trace",
]  # fmt: skip
_NAMES = [
    "aten::mm", "ProfilerStep#3", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "cudaLaunchKernel", "cudaStreamSynchronize", "Memcpy HtoD (Pageable -> Device)",
    'void k<float, "q">(int)', "naïve ✓ kernel", "tab\tand\nnewline", "emoji 🚀", "back\\slash", "",
    "[memory]", "[memory]\t", "[OutOfMemory]",
]  # fmt: skip


def _number_text(rng: random.Random) -> str:
    """Numbers in every form the profiler or another writer might print."""
    kind = rng.randrange(12)
    if kind == 0:
        return str(rng.randrange(-(10**6), 10**16))
    if kind == 1:  # epoch µs with one to three decimals (17-20 significant digits)
        return f"{rng.randrange(1_600_000_000_000_000, 1_800_000_000_000_000)}.{rng.randrange(1000):0{rng.randint(1, 3)}d}"
    if kind == 2:  # repr of an epoch float: 16-17 digits, ties among them
        return repr(
            rng.randrange(1_600_000_000_000_000, 1_800_000_000_000_000) + rng.choice([0.25, 0.5, 0.75, 0.0])
        )
    if kind == 3:
        return repr(rng.uniform(-1e6, 1e9))
    if kind == 4:
        return f"{rng.uniform(0, 1e4):.{rng.randint(0, 9)}f}"
    if kind == 5:
        return f"{rng.uniform(-1e3, 1e3):.{rng.randint(1, 17)}e}"
    if kind == 6:
        return rng.choice(["0", "-0", "0.0", "-0.0", "1E2", "1e-7", "0.0005", "0.00049", "9.9995", "1.0000"])
    if kind == 7:  # values at the scanner's limits
        return rng.choice(
            ["9223372036854775807", "-9223372036854775808", "9007199254740993", "8999999999999999.5",
             "9000000000000001.25", "1e16", "123456789012345678.9", "0.000123456789012345678"]
        )  # fmt: skip
    if kind == 8:
        return repr(rng.random() * 10 ** rng.randint(-6, 15))
    if kind == 9:
        return f"{rng.randrange(10**15, 10**16)}.{rng.randrange(10)}"
    if kind == 10:
        return str(rng.randrange(-(2**63), 2**63))
    return f"{rng.randrange(10**12)}.{rng.randrange(10**6):06d}"


def _value(rng: random.Random, *, ids: bool = False) -> str:
    kind = rng.randrange(10)
    if kind < 4:
        return _number_text(rng)
    if kind < 6:
        if ids:
            return json.dumps(rng.choice(["12", "stream 7", "-3", "0x1f", "0xzz", "7.5", "abc", ""]))
        return json.dumps(rng.choice(_NAMES), ensure_ascii=rng.random() < 0.5)
    return rng.choice(["null", "true", "false", "[]", '[1, {"a": [2]}]', '{"x": {"y": null}}'])


def _event(rng: random.Random) -> str:
    fields: list[tuple[str, str]] = []
    if rng.random() < 0.95:
        fields.append(
            ("ph", json.dumps("X" if rng.random() < 0.7 else rng.choice(["f", "s", "i", "i", "i", "M", "x"])))
        )
    if rng.random() < 0.95:
        fields.append(("cat", json.dumps(rng.choice(_CATEGORIES)) if rng.random() < 0.9 else _value(rng)))
    fields.append(
        ("name", json.dumps(rng.choice(_NAMES), ensure_ascii=False) if rng.random() < 0.9 else _value(rng))
    )
    for key in ("pid", "tid"):
        if rng.random() < 0.95:
            fields.append((key, str(rng.randrange(4)) if rng.random() < 0.8 else _value(rng, ids=True)))
    for key in ("ts", "dur"):
        if rng.random() < 0.97:
            fields.append((key, _number_text(rng) if rng.random() < 0.9 else _value(rng)))
    if rng.random() < 0.8:
        args = []
        for key in ("External id", "external id", "correlation", "device", "stream", "bytes", "Python id",
                    "Python parent id", "Call stack", "Comms Id", "Input Dims", "Device Type", "Device Id",
                    "Bytes", "Total Allocated", "Total Reserved", "Addr", "Seq", "Process Group Name"):  # fmt: skip
            if rng.random() < 0.4:
                value = (
                    str(rng.randrange(10**6))
                    if rng.random() < 0.7
                    else ("18446744073709551616" if key == "Comms Id" else _value(rng, ids=True))
                )
                args.append(f"{json.dumps(key)}: {value}")
        fields.append(("args", "{" + ", ".join(args) + "}" if rng.random() < 0.95 else _value(rng)))
    if rng.random() < 0.05 and fields:  # a duplicate key: the last one wins, as in a dict
        key, _ = rng.choice(fields)
        fields.append((key, _value(rng)))
    rng.shuffle(fields)
    sep = rng.choice([", ", ",", ",\n    "])
    return "{" + sep.join(f'"{k}": {v}' for k, v in fields) + "}"


def _trace_text(rng: random.Random, events: int) -> str:
    body = [_event(rng) for _ in range(events)]
    layout = rng.randrange(3)
    joined = (",\n  " if layout == 0 else ",\n" if layout == 1 else ",").join(body)
    meta = '"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "G"}], "baseTimeNanoseconds": 17'
    if rng.random() < 0.2:
        return "[" + joined + "]"
    if rng.random() < 0.5:
        return "{" + meta + ', "traceEvents": [\n  ' + joined + '\n], "traceName": "t"}'
    return '{"traceEvents": [' + joined + "], " + meta + "}"


@pytest.mark.parametrize("seed", range(40))
def test_random_traces_read_like_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    text = _trace_text(rng, rng.randint(0, 200)).encode()
    gzipped = rng.random() < 0.3  # streamed through gunzip, else mapped
    path = tmp_path / ("random.json.gz" if gzipped else "random.json")
    path.write_bytes(gzip.compress(text) if gzipped else text)
    monkeypatch.setattr(native, "BLOCK_BYTES", rng.choice([7, 200, 4096, 1 << 20]))
    reference = load_trace_reference(path)
    assert_same_trace(_native(path) if native.AVAILABLE else load_trace(path), reference)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")  # and the pure-Python fallback, on the same file
    assert_same_trace(load_trace(path), reference)


#: Keys the scanner may predict (the bytes of a key at the same place in an earlier event) next
#: to keys that must not be taken for them: escaped spellings, prefixes, extensions, non-ASCII.
_KEY_SPELLINGS = {
    "ts": ["ts", "\\u0074s", "t", "tss", "tś"],
    "cat": ["cat", "c\\u0061t", "ca", "cats", "cät"],
    "args": ["args", "\\u0061rgs", "arg", "argsx", "árgs"],
    "correlation": ["correlation", "correlatio\\u006e", "correlatio", "correlations", "corrélation"],
}


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_predicted_keys_read_like_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Runs of events with one layout (so each key is predicted from the one before) broken by
    events whose key at the same place is another spelling, a prefix or an extension of it, or
    the same key escaped: every event reads as the reference reads it, in any run window."""
    rng = random.Random(seed)
    events = []
    for i in range(400):
        deviant = rng.random() < 0.15
        spelled = {key: rng.choice(forms) if deviant else key for key, forms in _KEY_SPELLINGS.items()}
        args = f'{{"{spelled["correlation"]}": {i}, "device": 0, "stream": 7}}'
        events.append(
            f'{{"ph": "X", "{spelled["cat"]}": "kernel", "name": "k{i % 5}", "pid": 0, "tid": 7, '
            f'"{spelled["ts"]}": {1000 + i}.5, "dur": 2.25, "{spelled["args"]}": {args}}}'
        )
    path = tmp_path / "keys.json"
    path.write_text('{"traceEvents": [\n' + ",\n".join(events) + "\n]}")
    monkeypatch.setattr(native, "BLOCK_BYTES", rng.choice([13, 100, 1 << 20]))
    reference = load_trace_reference(path)
    assert_same_trace(_native(path), reference)
    # the deviant events make a difference the comparison sees: not every row is a kernel with a time
    assert 250 < reference.gpu.height < 400


# ----------------------------------------------------- beyond JSON, as Python reads it; errors --

_PYTHON_JSON = {
    "NaN time": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": NaN, "dur": 1}',
    "infinite duration": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": -Infinity}',
    "NaN skipped": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "args": {"x": [NaN]}}',
    "escaped key": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "\\u0074s": 5, "dur": 1}',
    "escaped args key": '{"ph": "X", "cat": "kernel", "name": "a", "ts": 5, "\\u0061rgs": {"\\u0064evice": 3}}',
    "escaped phase": '{"ph": "\\u0058", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": 1}',
    "memory records": '{"ph": "i", "name": "[memory]", "ts": 7.5, "args": {"Bytes": -4, "Device Id": "-1"}},'
    ' {"ph": "\\u0069", "name": "\\u005bmemory]", "ts": 3, "args": {"Total Allocated": 1e3, "Device Type": 1}},'
    ' {"ph": "i", "name": "[memory]", "ts": "late", "args": {"Bytes": 1}},'
    ' {"ph": "X", "name": "[memory]", "cat": "cpu_op", "ts": 9, "args": {"Bytes": 2}},'
    ' {"ph": "i", "name": "[OutOfMemory]", "ts": 4, "args": {"Bytes": 3}}',
    "huge kept int": '{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": 5, "dur": 1,'
    ' "args": {"correlation": 99999999999999999999}}',
    "huge int name": '{"ph": "X", "cat": "cpu_op", "name": -123456789012345678901234567890, "ts": 5}',
    "float ids beyond int64": '{"ph": "X", "cat": "kernel", "name": "k", "pid": 1e19, "tid": -9.3e18, "ts": 5,'
    ' "args": {"External id": 1e300, "correlation": 9223372036854775808.0, "device": 1e19, "stream": 2e19,'
    ' "bytes": 5e18}}',
    "non-object event": '7, {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": 1}, [],'
    ' "s", null',
    "overflowing float": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1e999, "dur": 1}',
    "long float": '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.'
    + "5" * 100
    + ', "dur": 1}',
    "lone surrogates": '{"ph": "X", "cat": "cpu_\\ud800op", "name": "a\\udc00b\\ud83d", "ts": 5,'
    ' "args": {"Call stack": "x.py(1): f\\udfff"}}, {"ph": "X", "cat": "cpu_op", "name": "\\ud83d\\ude80", "ts": 6}',
}


@needs_native
@pytest.mark.parametrize("case", sorted(_PYTHON_JSON))
def test_what_python_json_reads_the_scanner_reads_alike(tmp_path: Path, case: str) -> None:
    path = tmp_path / "odd.json"
    path.write_text('{"traceEvents": [' + _PYTHON_JSON[case] + "]}")
    reference = load_trace_reference(path)
    assert_same_trace(_native(path), reference)
    assert reference.meta.event_count >= 1


@needs_native
@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "ts": 1}], "traceEvents": []}',
        '{"traceEvents": [{"ph": "X", "ts": 1}], "traceEvents": [{"ph": "X", "ts": 2}]}',
        '{"traceEvents": null, "traceEvents": [{"ph": "X", "ts": 2}]}',
        '{"traceEvents": [{"ph": "X", "ts": 1}], "a": {"traceEvents": 1, "traceEvents": 2}}',
    ],
)
def test_a_repeated_trace_events_key_reads_as_the_reference(tmp_path: Path, text: str) -> None:
    """The reference (a dict) keeps the last ``traceEvents``; the scanner, which reads the first,
    leaves such a file to the pure-Python path rather than guess."""
    path = tmp_path / "twice.json"
    path.write_text(text)
    assert_same_trace(load_trace(path), load_trace_reference(path))


@needs_native
@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "name": "a\x01"}]}',  # a raw control character in a string
        '{"traceEvents": [{"ph": "X", "ts": 01}]}',  # a leading zero
        '{"traceEvents": [{"ph": "X"},]}',  # a trailing comma
        '{"traceEvents": [{"ph": "X"} {"ph": "X"}]}',  # a missing comma
        '{"traceEvents": [{"ph": "X", "name": "\\x"}]}',  # a bad escape
        '{"traceEvents": [{"ph": "X"}]',  # the document does not close
        '{"traceEvents": [{"ph": "X"}]} trailing',
    ],
)
def test_invalid_json_is_never_read_as_a_trace(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        _native(path)
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_trace_reference(path)


@needs_native
@pytest.mark.parametrize("text", [b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82"])
@pytest.mark.parametrize(
    "field", ['"name": "a{}b"', '"other": "a{}b", "name": "n"', '"args": {{"grid": "a{}b"}}, "name": "n"']
)
def test_invalid_utf8_is_refused_by_every_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, field: str
) -> None:
    """Overlong forms, UTF-8-encoded surrogates, code points past U+10FFFF, cut sequences: in a
    field the tables read, and in fields they skip (the pure-Python loader read those unchecked)."""
    path = tmp_path / "bad.json"
    head, tail = field.format("\0").encode().split(b"\0")
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1, ' + head + text + tail + b"}]}")
    with pytest.raises(TraceFormatError, match="invalid UTF-8"):
        _native(path)
    with pytest.raises(TraceFormatError, match="invalid UTF-8"):
        load_trace_reference(path)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
    with pytest.raises(TraceFormatError, match="invalid UTF-8"):
        load_trace(path)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _perfetto_bytes(packets: int) -> bytes:
    """A Perfetto protobuf ``Trace`` as Kineto's Perfetto writer makes one (kineto PR 1413): each
    ``packet`` (field 1, length-delimited: tag 0x0a) holds a timestamp (field 8), a trusted
    sequence id (field 10) and a track event (field 11) with a name (field 23)."""
    out = bytearray()
    for index in range(packets):
        name = f"aten::mm {index}".encode()
        event = b"\xba\x01" + _varint(len(name)) + name  # TrackEvent.name = 23
        packet = (
            b"\x40" + _varint(1_700_000_000_000 + index) + b"\x50\x01" + b"\x5a" + _varint(len(event)) + event
        )
        out += b"\x0a" + _varint(len(packet)) + packet
    return bytes(out)


@needs_native
@pytest.mark.parametrize("packets", [1, 3, 400])
@pytest.mark.parametrize("gz", [False, True])
def test_a_perfetto_protobuf_trace_is_refused_by_every_loader_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packets: int, gz: bool
) -> None:
    """Kineto's Perfetto output (``.pftrace``) is binary protobuf whose first byte is a newline:
    each loader says what it is and how to write JSON, not "not valid JSON"."""
    data = _perfetto_bytes(packets)
    assert data[0] == 0x0A and data[1] not in b" \t\r\n{["
    path = tmp_path / ("trace.pftrace.gz" if gz else "trace.pftrace")
    path.write_bytes(gzip.compress(data) if gz else data)
    words = r"Perfetto protobuf trace \(\.pftrace\).*export_chrome_trace"
    with pytest.raises(TraceFormatError, match=words):
        _native(path)
    with pytest.raises(TraceFormatError, match=words):
        load_trace_reference(path)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
    with pytest.raises(TraceFormatError, match=words):
        load_trace(path)


@pytest.mark.parametrize("lead", ["\n", "\n\n  ", "\n\t\r\n "])
def test_json_that_starts_with_a_newline_is_not_taken_for_perfetto(tmp_path: Path, lead: str) -> None:
    path = tmp_path / "lead.json"
    path.write_text(lead + '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
                    '"ts": 10, "dur": 5}]}')  # fmt: skip
    assert load_trace(path).gpu.height == 1
    assert_same_trace(load_trace(path), load_trace_reference(path))


@needs_native
def test_a_name_of_71_digits_reads_alike_in_every_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A number as a name becomes its digits (the reference's ``str(value)``); the pure-Python loader
    ended in exit 3 on one too large for a polars integer."""
    digits = "1" * 71
    path = tmp_path / "digits.json"
    kernel = '{"ph": "X", "cat": "kernel", "name": D, "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"device": 0}}'
    op = '{"ph": "X", "cat": D, "name": "k", "ts": 20, "dur": 1}'
    path.write_text(f'{{"traceEvents": [{kernel}, {op}]}}'.replace("D,", digits + ","))
    reference = load_trace_reference(path)
    assert reference.gpu.get_column("name").to_list() == [digits]
    assert_same_trace(_native(path), reference)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
    assert_same_trace(load_trace(path), reference)


@needs_native
@pytest.mark.parametrize(
    ("dims", "kept"),
    [
        # whitespace past the scanner's cut inside a shape: the shape Python's json reads
        ('[[1024, 64],PAD[], ["a \\" b"]]', '[[1024,64],[],["a \\" b"]]'),
        # still longer than the cut without its whitespace: no shape, as its compact text is too long
        ("[" + ",".join(["[1]"] * 20_000) + "]", None),
        # written long, read short: a number's 70,000 zeros, an object's repeated key
        ("[1." + "0" * 70_000 + "]", "[1.0]"),
        ("{" + ",".join(['"a":1'] * 20_000) + "}", '{"a":1}'),
    ],
)
def test_a_shape_longer_than_the_scanners_cut_reads_as_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dims: str, kept: str | None
) -> None:
    """A fuzzed trace padded an ``Input Dims`` list with 70 kB of spaces: the native loader took it for
    a cut string (null), the reference for the short shape it is. Lists and objects longer than the
    cut cross into Python whole (up to 16 times the cut without their whitespace), at every block
    size, and read as Python's json reads them."""
    dims = dims.replace("PAD", " " * (scanner.CUT_BYTES + 10))
    assert len(dims) > scanner.CUT_BYTES
    op = '{"ph": "X", "cat": "cpu_op", "name": "aten::to", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "args": {"Input Dims": D}}'
    path = tmp_path / "padded.json"
    path.write_text(
        '{"traceEvents": [' + op.replace("D}", dims + "}") + ", " + op.replace("D}", "[[2]]}") + "]}"
    )
    reference = load_trace_reference(path)
    assert reference.cpu_ops.get_column("input_dims").to_list() == [kept, "[[2]]"]
    for block in (4096, 1 << 20):
        monkeypatch.setattr(native, "BLOCK_BYTES", block)
        assert_same_trace(_native(path), reference)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
    assert_same_trace(load_trace(path), reference)


def _times_trace(tmp_path: Path, texts: list[str]) -> Path:
    """A trace of one operator ``n<i>`` per text, the text written as its ``ts`` and its ``dur``."""
    events = ",\n".join(
        f'{{"ph": "X", "cat": "cpu_op", "name": "n{i}", "pid": 1, "tid": 1, "ts": {text}, "dur": {text}}}'
        for i, text in enumerate(texts)
    )
    path = tmp_path / "times.json"
    path.write_text('{"traceEvents": [\n' + events + "\n]}")
    return path


def test_float_times_match_python_repr_rule_on_hard_values(tmp_path: Path) -> None:
    """Times the scanner converts from their text (ties, 16-19 digits) equal the repr-based rule."""
    values = ["1712195495519695.8", "1712195495519695.7", "1712195495519695.75", "1712195495519695.25",
              "1712195495519694.2", "8999999999999999.5", "4503599627370496.5", "1234567.1234567",
              "0.0004", "0.00049999", "0.0005", "999.9995", "1.9999999999999998", "-12.3455"]  # fmt: skip
    trace = load_trace(_times_trace(tmp_path, values))
    expected = [_repr_rule(float(v)) for v in values]
    by_name = dict(zip(trace.cpu_ops.get_column("name"), trace.cpu_ops.get_column("ts"), strict=True))
    assert [by_name.get(f"n{i}") for i in range(len(values))] == expected
    dur_expected = [max(e, 0) for e in expected]
    durs = dict(zip(trace.cpu_ops.get_column("name"), trace.cpu_ops.get_column("dur"), strict=True))
    assert [durs.get(f"n{i}") for i in range(len(values))] == dur_expected


def _time_texts(rng: random.Random, count: int) -> list[str]:
    """Float texts around every edge of the scanner's text-only reading of times: whole parts of
    1 to 17 digits (about 9e15 and 2^53 too), 0 to 7 fraction digits, trailing zeros, a zero whole
    part, exponents, signs."""
    edges = ["8999999999999999.0", "9000000000000000.0", "9000000000000001.0", "9007199254740993.0",
             "999999999999999.9", "999999999999999.95", "100000000000000.5", "1.0005", "1.00049",
             "0.5", "-0.0", "0.0", "-1.5", "12.3e2", "1E-3", "5.000", "-8999999999999999.00"]  # fmt: skip
    texts = list(edges)
    while len(texts) < count:
        digits = "".join(rng.choice("0123456789") for _ in range(24))
        cut = rng.randrange(17)
        whole, fraction = str(rng.randrange(1, 10)) + digits[:cut], digits[cut : cut + rng.randrange(8)]
        text = f"{'-' if rng.random() < 0.1 else ''}{whole}.{fraction or '0'}{'0' * rng.randrange(3)}"
        if rng.random() < 0.05:
            text += f"e{rng.randrange(-3, 4)}"
        texts.append(text)
    return texts


@needs_native
def test_float_times_read_from_their_text_equal_the_reference(tmp_path: Path) -> None:
    """Every float time, whether the scanner reads it from its text alone, with its double, or
    leaves it to Python, loads as the reference loader reads it (2,000 texts, seeded)."""
    texts = _time_texts(random.Random(13), 2000)
    path = _times_trace(tmp_path, texts)
    native_trace = _native(path)
    assert_same_trace(native_trace, load_trace_reference(path))
    # the comparison is not of two empty tables: the rows with a time the tables can hold are kept
    assert native_trace.cpu_ops.height >= 0.8 * len(texts)


def _repr_rule(value: float) -> int:
    """Written out independently of the loader: ns from the plain-notation text of ``repr``."""
    text = repr(value)
    assert "e" not in text and math.isfinite(value)
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("-").partition(".")
    ns = (
        int(whole) * 1000
        + int((fraction + "000")[:3])
        + (1 if len(fraction) > 3 and fraction[3] >= "5" else 0)
    )
    return -ns if negative else ns


def _pretty_trace(events_first: bool, nested_like_events: str) -> str:
    """The first event on a line of its own at two spaces, like Kineto, and metadata whose list
    items sit at that indentation too. ``some``: a few args hold an object that starts such a line;
    ``all``: every event does, and events follow each other on one line, so every such line after
    the first is inside an event."""
    rng = random.Random(7)
    events = []
    for i in range(300):
        args = f'"External id": {i}, "correlation": {i}'
        every = {"none": 0, "some": 50, "all": 1}[nested_like_events]
        # an object in args that starts a line indented like an event
        nested = '"list": [\n  {"x": 1}], ' if every and i % every == 0 else ""
        args_text = "{" + nested + args + "}"
        cat = rng.choice(["kernel", "cuda_runtime", "cpu_op"])
        body = (
            f'"ph": "X", "cat": "{cat}", "name": "n{i % 7}", "pid": 1, "tid": 1, '
            f'"ts": {1000 + i * 10}.5, "dur": 3.25, "args": {args_text}'
        )
        events.append("{" + body + "}" if nested_like_events == "all" else "  {\n    " + body + "\n  }")
    if nested_like_events == "all":
        array = '"traceEvents": [\n  ' + ", ".join(events) + "\n]"
    else:
        array = '"traceEvents": [\n' + ",\n".join(events) + "\n]"
    devices = '"deviceProperties": [\n  {"id": 0, "name": "G0"},\n  {"id": 1, "name": "G1"}\n]'
    parts = [array, devices] if events_first else [devices, array]
    return "{\n" + ",\n".join(parts) + "\n}"


@needs_native
@pytest.mark.parametrize("events_first", [True, False])
@pytest.mark.parametrize("nested_like_events", ["none", "some", "all"])
@pytest.mark.parametrize("block", [97, 1000, 1 << 20])
@pytest.mark.parametrize("gzipped", [False, True], ids=["mapped", "gzip"])
def test_runs_cut_between_events_are_checked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    events_first: bool,
    nested_like_events: str,
    block: int,
    gzipped: bool,
) -> None:
    """Cuts at "newline, indent, {" go to two scanning threads; a cut that is not between events
    (an args object on such a line) sends the load back to one scan after another, and metadata
    after the array (items indented like events) ends up in the document, not in the tables."""
    text = _pretty_trace(events_first, nested_like_events).encode()
    path = tmp_path / ("pretty.json.gz" if gzipped else "pretty.json")
    path.write_bytes(gzip.compress(text) if gzipped else text)
    monkeypatch.setattr(native, "BLOCK_BYTES", block)
    threads: list[int] = []
    load = native._load
    monkeypatch.setattr(native, "_load", lambda *a: threads.append(a[2]) or load(*a))
    fast = _native(path)
    assert_same_trace(fast, load_trace_reference(path))
    assert fast.meta.gpus_listed == 2
    # When every such line after the first is inside an event, any cut is a wrong one: with
    # blocks smaller than the file, the load starts again in one thread. A gunzipped stream is
    # cut where a mapped file is.
    if nested_like_events == "all" and block < 1 << 20:
        assert threads == [2, 1]
    else:
        assert threads == [2]


class _RowsSeen:
    """The scanner module, recording the rows of every scan (to check the cap per scan)."""

    def __init__(self, scan: object) -> None:
        self._scan = scan
        self.Invalid = scan.Invalid  # type: ignore[attr-defined]
        self.events_start = scan.events_start  # type: ignore[attr-defined]
        self.rows: list[int] = []
        self.full = 0

    def scan(self, *args: object) -> tuple[object, ...]:
        result: tuple[object, ...] = self._scan.scan(*args)  # type: ignore[attr-defined]
        self.rows.append(int(result[5]))  # type: ignore[call-overload]
        self.full += bool(result[11])
        return result


@needs_native
@pytest.mark.parametrize("cap", [1, 3, 50])
@pytest.mark.parametrize("layout", ["kineto", "one-line"])
@pytest.mark.parametrize("gzipped", [False, True], ids=["mapped", "gzip"])
def test_a_scan_stops_at_its_row_cap_and_the_next_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int, layout: str, gzipped: bool
) -> None:
    """Memory follows bytes, not events: no scan makes more than ``MAX_SCAN_ROWS`` rows (X and
    i events), the next one resumes after the last event, and the tables are the reference's, in
    runs cut between events (two threads) and in one scan after another."""
    text = _pretty_trace(True, "none" if layout == "kineto" else "all").encode()
    memory = (
        b'{"ph": "i", "name": "[memory]", "ts": 5, "args": {"Bytes": 8, "Device Id": 0, "Device Type": 1}}'
    )
    text = text.replace(b'"traceEvents": [\n', b'"traceEvents": [\n  ' + memory + b",\n", 1)
    path = tmp_path / ("trace.json.gz" if gzipped else "trace.json")
    path.write_bytes(gzip.compress(text) if gzipped else text)
    seen = _RowsSeen(native._scan)
    monkeypatch.setattr(native, "_scan", seen)
    monkeypatch.setattr(native, "MAX_SCAN_ROWS", cap)
    monkeypatch.setattr(native, "BLOCK_BYTES", 4096)  # several runs, each cut by the cap
    threads: list[int] = []
    load = native._load
    monkeypatch.setattr(native, "_load", lambda *a: threads.append(a[2]) or seen.rows.clear() or load(*a))
    assert_same_trace(_native(path), load_trace_reference(path))
    assert max(seen.rows) <= cap
    assert sum(seen.rows) == 301  # every X and i event, once (in the load that completed)
    assert seen.full and len(seen.rows) >= 301 / cap
    assert threads == ([2] if layout == "kineto" else [2, 1]), threads


# ------------------------------------------------------------ state across scan windows, limits --


def _compact(events: list[str], kineto_layout: bool) -> str:
    joiner = ",\n  " if kineto_layout else ","
    return '{"traceEvents": [\n  ' + joiner.join(events) + "\n]}"


@needs_native
@pytest.mark.parametrize("kineto_layout", [False, True], ids=["compact", "kineto"])
@pytest.mark.parametrize("gzipped", [False, True], ids=["mapped", "gzip"])
def test_a_missing_comma_is_refused_at_every_window_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kineto_layout: bool, gzipped: bool
) -> None:
    """Every window size from 8 bytes to the whole text, so that a window ends exactly after the
    event before the missing comma (and anywhere else); the same text with the comma loads."""
    events = [f'{{"ph": "X", "cat": "cpu_op", "name": "op{i}", "ts": {i}, "dur": 1}}' for i in range(6)]
    good = _compact(events, kineto_layout)
    cut = good.index('{"ph": "X", "cat": "cpu_op", "name": "op3"')
    bad = good[:cut].rstrip().removesuffix(",") + "\n  " + good[cut:]
    assert len(bad) == len(good) - 1 or not kineto_layout
    for name, text in (("good", good), ("bad", bad)):
        path = tmp_path / (name + (".json.gz" if gzipped else ".json"))
        path.write_bytes(gzip.compress(text.encode()) if gzipped else text.encode())
    reference = load_trace_reference(tmp_path / ("good.json.gz" if gzipped else "good.json"))
    for block in range(4, len(bad) + 1):
        monkeypatch.setattr(native, "BLOCK_BYTES", block)
        with pytest.raises(TraceFormatError, match="not valid JSON"):
            _native(tmp_path / ("bad.json.gz" if gzipped else "bad.json"))
        if block % 8 == 0:
            assert_same_trace(_native(tmp_path / ("good.json.gz" if gzipped else "good.json")), reference)


@pytest.fixture
def small_limits() -> Iterator[None]:
    """The scanner configured with tiny limits (depth 4, strings of 40 bytes, 30-digit ints)."""
    assert native._scan is not None
    fields = scanner.SCANNER_FIELDS
    native._scan.configure(fields, (4, 40, scanner.CUT_BYTES, scanner.CUT_PREFIX, 30))
    try:
        yield
    finally:
        native._scan.configure(
            fields,
            (
                limits.MAX_DEPTH,
                limits.MAX_STRING_BYTES,
                scanner.CUT_BYTES,
                scanner.CUT_PREFIX,
                limits.MAX_INT_DIGITS,
            ),
        )


@needs_native
@pytest.mark.parametrize(
    ("event", "words"),
    [
        # '{"traceEvents": [' is 17 bytes; the event's members start 1 byte later, "ts": 1 ends at 38
        ('{"ph": "X", "ts": 1, "args": {"a": []}}', "nested deeper than 512 levels at byte 52"),
        ('{"ph": "X", "ts": 1, "x": [[[]]]}', "nested deeper than 512 levels at byte 44"),
        ('{"ph": "X", "ts": 1, "name": "' + "n" * 41 + '"}', "a string longer than 1 GiB at byte 46"),
        ('{"ph": "X", "ts": 1, "x": "' + "n" * 41 + '"}', "a string longer than 1 GiB at byte 43"),
        ('{"ph": "X", "ts": 1, "x": ' + "9" * 31 + "}", "more than 4300 digits at byte 43"),
    ],
)
def test_limits_stop_the_scanner_with_a_clear_line(
    tmp_path: Path, small_limits: None, event: str, words: str
) -> None:
    """The messages name the configured limits of :mod:`.limits` (the scanner is given smaller
    ones here): nesting counts the top-level object, the events array, the event and args."""
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + event + "]}")
    with pytest.raises(TraceFormatError, match=re.escape(words)):
        _native(path)


@needs_native
def test_limits_allow_what_is_within_them(tmp_path: Path, small_limits: None) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        '{"traceEvents": [{"ph": "X", "ts": 1, "name": "' + "n" * 40 + '", "x": [' + "9" * 30 + "]}]}"
    )
    assert_same_trace(_native(path), load_trace_reference(path))


def test_more_events_than_the_limit_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_EVENTS", 3)
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ", ".join(['{"ph": "X", "ts": 1}'] * 4) + "]}")
    for native_setting in ("1", "0"):
        monkeypatch.setenv("TRACEINSIGHT_NATIVE", native_setting)
        with pytest.raises(TraceFormatError, match="more than 3 events"):
            load_trace(path)
    with pytest.raises(TraceFormatError, match="more than 3 events"):
        load_trace_reference(path)


@needs_native
def test_the_scanned_columns_are_handed_over_without_a_copy_and_outlive_the_result() -> None:
    """The scanner's columns reach Python as read-only buffers of its own memory, one per field's
    values and kinds, the phases, then the instant fields' over the ``i`` rows; an array made from
    one keeps it alive once the scan's result is gone. Values checked against the events as
    written (ints as ints, strings as indexes into the result's strings)."""
    import gc

    import numpy as np

    events: list[dict[str, object]] = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 1, "tid": 7, "ts": 1000 + 10 * i, "dur": 5 + i}
        for i in range(40)
    ]
    events.insert(3, {"ph": "i", "name": "[memory]", "pid": 1, "tid": 7, "ts": 1005, "args": {"Bytes": 8}})
    events.insert(9, {"ph": "f", "id": 1, "pid": 1, "tid": 7, "ts": 1006})  # no row
    text = json.dumps(events).encode()
    result = native._scan.scan(text, 1, 0, 1, 0)  # type: ignore[union-attr]
    rows, columns, strings = result[5], result[6], result[7]
    row_fields, side_fields = native._ROW_FIELDS, native._INSTANT_FIELDS
    width, side = len(row_fields), len(side_fields)
    rowed = [e for e in events if e["ph"] in ("X", "i")]
    assert rows == len(rowed) == 41
    assert len(columns) == 2 * width + 1 + 2 * side
    lengths = [len(memoryview(block)) for block in columns]
    assert lengths == [rows * 8] * width + [rows] * width + [rows] + [8] * side + [1] * side
    with pytest.raises(TypeError):
        memoryview(columns[0])[0] = 1  # read-only, like the bytes it replaces
    keys = [f.key for f in schema.EVENT_FIELDS if not f.memory]
    ts = np.frombuffer(columns[keys.index("ts")], dtype=np.int64)
    name_values = np.frombuffer(columns[keys.index("name")], dtype=np.int64)
    name_kinds = np.frombuffer(columns[width + keys.index("name")], dtype=np.uint8)
    phases = np.frombuffer(columns[2 * width], dtype=np.uint8)
    names = [strings[i].decode() for i in name_values]
    del result, columns, strings
    gc.collect()
    filler = [bytes(64) for _ in range(10_000)]  # reuse whatever the scan freed
    assert ts.tolist() == [e["ts"] for e in rowed]
    assert names == [e["name"] for e in rowed]
    assert set(name_kinds.tolist()) == {3}  # strings
    assert phases.tolist() == [1 if e["ph"] == "X" else 2 for e in rowed]
    del filler


def test_the_invalid_utf8_offset_counts_a_character_cut_by_a_block(tmp_path: Path) -> None:
    """The pure-Python loader checks UTF-8 16 MiB at a time: a character cut by a block's end moved
    the offset it named by the bytes held over (16,777,218 for a bad byte at 16,777,217)."""
    from traceinsight.load.fallback import check_utf8

    block = 16 << 20
    raw = bytearray(b"a" * (block - 1) + "é".encode() + b"\xff" + b"b" * 10)  # é across the block's end
    with pytest.raises(TraceFormatError) as raised:
        check_utf8(raw, tmp_path / "t.json")
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        expected = error.start
    assert f"invalid UTF-8 at byte {expected}" in str(raised.value)
