"""Loader: every real trace loads; eras, times, ids and legacy names are normalised once."""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from tracebuild import SAMPLES, kernel, read_events, runtime, write_trace

from traceinsight.errors import TraceUnreadable
from traceinsight.load import load_trace, load_trace_reference
from traceinsight.load import source as source_module
from traceinsight.load.source import open_trace
from traceinsight.load.text import clean_text, clean_texts

ALL_SAMPLES = sorted(p for p in SAMPLES.rglob("*.json*"))
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def test_sample_folder_holds_the_shared_collection() -> None:
    assert len(ALL_SAMPLES) >= 23


@pytest.mark.parametrize("path", ALL_SAMPLES, ids=lambda p: p.name)
def test_every_sample_loads_with_all_gpu_activity(path: Path) -> None:
    trace = load_trace(path)
    _, events = read_events(path)
    expected = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS and "ts" in e)
    assert trace.gpu.height == expected
    assert trace.meta.event_count == len(events)
    for table in (trace.gpu, trace.runtime, trace.cpu_ops, trace.python, trace.annotations):
        assert table.schema["ts"] == pl.Int64
        assert (table.get_column("end") >= table.get_column("ts")).all()


def test_integer_microseconds_become_exact_nanoseconds() -> None:
    path = SAMPLES / "gp100_mlp_pageable_sync.json.gz"
    _, events = read_events(path)
    first = min(e["ts"] for e in events if e.get("cat") == "kernel")
    trace = load_trace(path)
    assert trace.gpu.filter(pl.col("kind") == "kernel").get_column("ts").min() == first * 1000


def test_float_microseconds_keep_the_nanosecond_fraction(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.json", [kernel(1000.123, 2.5), kernel(2000.0004, 1.25)])
    gpu = load_trace(path).gpu.sort("ts")
    assert gpu.get_column("ts").to_list() == [1000123, 2000000]
    assert gpu.get_column("dur").to_list() == [2500, 1250]


def test_base_time_relative_traces_record_the_base() -> None:
    trace = load_trace(SAMPLES / "h100_bert_small_stacks.json.gz")
    assert trace.meta.base_time_ns == 1751410836000000000
    assert trace.meta.era == "kineto-base-ns"


def test_legacy_2021_names_map_to_the_same_tables() -> None:
    path = SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"
    _, events = read_events(path)
    runtime_calls = sum(1 for e in events if e.get("cat") == "Runtime")
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    trace = load_trace(path)
    assert trace.meta.era == "legacy-2021"
    assert trace.runtime.height == runtime_calls
    # 2021 annotations are Operator events; they land in the annotations table
    names = set(trace.annotations.get_column("name").to_list())
    assert steps <= names
    # tids such as "stream 7" become stream numbers
    assert set(trace.gpu.get_column("stream").unique().to_list()) <= {7, 13, 14, 15, 16, 17, 18, 19, 20}


def test_bare_array_2020_trace_loads() -> None:
    path = SAMPLES / "v100_resnet50_2020_array_format.pt.trace.json.gz"
    top, events = read_events(path)
    assert top is None
    trace = load_trace(path)
    assert trace.meta.era == "array-2020"
    assert trace.gpu.height == sum(1 for e in events if e.get("cat") in GPU_CATS)


def test_integers_beyond_int64_do_not_break_loading() -> None:
    trace = load_trace(SAMPLES / "huge_integer_arg.pt.trace.json.gz")
    assert trace.gpu.height == 1
    assert trace.cpu_ops.get_column("name").to_list() == ["record_param_comms"]


def test_huge_integer_in_a_read_field_becomes_null(tmp_path: Path) -> None:
    event = kernel(10, 5)
    event["args"]["correlation"] = 2**70
    trace = load_trace(write_trace(tmp_path / "t.json", [event]))
    assert trace.gpu.get_column("correlation").to_list() == [None]


def test_string_pids_and_tids_are_parsed(tmp_path: Path) -> None:
    call = runtime("cudaLaunchKernel", 5, 2)
    call["pid"], call["tid"] = "4242", "77"
    trace = load_trace(write_trace(tmp_path / "t.json", [call]))
    assert trace.runtime.select("pid", "tid").row(0) == (4242, 77)


def test_events_in_any_order_give_the_same_tables(tmp_path: Path) -> None:
    events = [kernel(300, 10), kernel(100, 10), runtime("cudaStreamSynchronize", 50, 20), kernel(200, 10)]
    a = load_trace(write_trace(tmp_path / "a.json", events))
    b = load_trace(write_trace(tmp_path / "b.json", list(reversed(events))))
    assert a.gpu.sort("ts").equals(b.gpu.sort("ts"))


def test_gzip_and_plain_json_load_the_same(tmp_path: Path) -> None:
    events = [kernel(100, 10), kernel(200, 10)]
    plain = load_trace(write_trace(tmp_path / "t.json", events))
    packed = load_trace(write_trace(tmp_path / "t.json.gz", events, gz=True))
    assert plain.gpu.equals(packed.gpu)


def test_unexpected_value_types_fall_back_to_the_lenient_path(tmp_path: Path) -> None:
    odd = kernel(100, 10)
    odd["args"]["device"] = [0]  # not a scalar: the typed decoder rejects it
    odd["args"]["stream"] = {"id": 7}
    trace = load_trace(write_trace(tmp_path / "t.json", [odd, kernel(200, 10)]))
    assert trace.gpu.height == 2
    assert trace.gpu.sort("ts").get_column("device").to_list() == [0, 0]  # from pid


def test_devices_and_rank_come_from_metadata() -> None:
    path = SAMPLES / "a100_recsys_rank0.json.gz"
    top, _ = read_events(path)
    assert top is not None
    trace = load_trace(path)
    assert trace.meta.rank == top["distributedInfo"]["rank"]
    assert trace.meta.world_size == top["distributedInfo"]["world_size"]
    assert [d.name for d in trace.meta.devices] == [top["deviceProperties"][0]["name"]]


def test_missing_distributed_info_means_rank_zero() -> None:
    assert load_trace(SAMPLES / "no_distributed_info.json.gz").meta.rank == 0


def test_cuda_sync_events_are_their_own_table() -> None:
    path = SAMPLES / "a100_alexnet_cuda_sync.json.gz"
    _, events = read_events(path)
    expected = Counter(e["name"] for e in events if e.get("cat") == "cuda_sync")
    trace = load_trace(path)
    assert Counter(trace.cuda_sync.get_column("name").to_list()) == expected


def test_python_frames_keep_their_parent_links() -> None:
    path = SAMPLES / "b200_eager_stacks.json.gz"
    _, events = read_events(path)
    frames = [e for e in events if e.get("cat") == "python_function"]
    trace = load_trace(path)
    assert trace.python.height == len(frames)
    assert trace.python.get_column("parent_id").drop_nulls().len() == sum(
        1 for e in frames if isinstance(e["args"].get("Python parent id"), int)
    )


def test_gzip_written_by_torch_round_trips(tmp_path: Path) -> None:
    source = SAMPLES / "a100_item_event_sync.json.gz"
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    assert load_trace(plain).gpu.equals(load_trace(source).gpu)
    json.loads(plain.read_text())  # the copy is valid JSON


@pytest.mark.parametrize(
    ("times", "kept"),
    [((1e-7, 2e-6), 2), ((9.5e15, 1.5), 1), ((-5.25, 1.5), 2), ((1.5e3, 1e-9), 2), ((2**63, 1), 1)],
    ids=["tiny", "beyond-int64-ns-float", "negative", "tiny-duration", "beyond-int64-ns-int"],
)
def test_extreme_times_load_like_the_reference(tmp_path: Path, times: tuple[float, float], kept: int) -> None:
    path = write_trace(tmp_path / "t.json", [kernel(*times), kernel(1.0, 1.0)])
    fast, plain = load_trace(path), load_trace_reference(path)
    assert fast.gpu.equals(plain.gpu)
    # a time that an Int64 of ns cannot hold (after year 2262) drops the event, like a missing time
    assert fast.gpu.height == kept


# --- every trace string is data ---------------------------------------------------------------------


def _expected_clean(text: str) -> str:
    """Written out independently of the loader: control characters (C0, DEL, C1, bidi embeddings,
    overrides, isolates) become U+FFFD one for one; past 1024 characters, the first 992 are kept
    and the number of characters cut is noted."""
    replaced = "".join(
        "\ufffd"
        if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069
        else c
        for c in text
    )
    return replaced if len(replaced) <= 1024 else replaced[:992] + f"…(+{len(replaced) - 992} chars)"


def test_control_characters_in_names_are_replaced_one_for_one(tmp_path: Path) -> None:
    names = [
        "\x1b]0;title\x07",
        "a\tb\nc\r",
        "\u202eevil\u2069",
        "del\x7f c1\x85\x9b",
        "fine ✓ 🚀",
        "x" * 1025,
    ]
    path = write_trace(tmp_path / "t.json", [kernel(i * 10, 5, name=name) for i, name in enumerate(names)])
    for loaded in (load_trace(path), load_trace_reference(path)):
        assert loaded.gpu.sort("ts").get_column("name").to_list() == [_expected_clean(n) for n in names]


def test_trace_metadata_strings_are_cleaned(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.json",
        [kernel(0, 5)],
        deviceProperties=[{"id": 0, "name": "GPU\x1b[2J"}],
        traceName="\x1b]8;;https://x\x07t",
        distributedInfo={"rank": 0, "world_size": 1, "backend": "nccl\u202e"},
    )
    meta = load_trace(path).meta
    assert meta.devices[0].name == "GPU\ufffd[2J"
    assert meta.trace_name == "\ufffd]8;;https://x\ufffdt"
    assert meta.backend == "nccl\ufffd"


@pytest.mark.parametrize("path", ALL_SAMPLES, ids=lambda p: p.name)
def test_names_analyses_read_are_loaded_as_written(path: Path) -> None:
    """ProfilerStep#, copy names, DataLoader and optimizer annotations, Python frames: every such
    name of every sample is loaded unchanged (none is long or holds a control character)."""
    _, events = read_events(path)
    markers = ("ProfilerStep#", "Memcpy", "Memset", "enumerate(DataLoader)", "Optimizer.", ".py(")
    raw = {
        e["name"]
        for e in events
        if e.get("ph") == "X" and isinstance(e.get("name"), str) and any(m in e["name"] for m in markers)
    }
    trace = load_trace(path)
    loaded = set()
    for table in (
        trace.gpu,
        trace.runtime,
        trace.cpu_ops,
        trace.python,
        trace.annotations,
        trace.gpu_annotations,
    ):
        loaded |= set(table.get_column("name").to_list())
    assert raw <= loaded
    assert all(_expected_clean(name) == name for name in raw)


def test_clean_text_is_clean_texts_for_one_string() -> None:
    """The one-string form (used for one-row columns and metadata) agrees with the column form."""
    import random

    rng = random.Random(3)
    alphabet = ["a", "\x1b", "\t", "\u202e", "\u2067", "é", "🚀", "\x85", "\x7f", "\ufffd", " ", "\u2028"]
    values = [
        "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 5, 1023, 1024, 1025, 3000])))
        for _ in range(200)
    ]
    assert (
        clean_texts(pl.Series(values)).to_list()
        == [clean_text(v) for v in values]
        == [_expected_clean(v) for v in values]
    )


def test_events_dropped_for_impossible_times_are_counted(tmp_path: Path) -> None:
    good = kernel(10, 5)
    late, nan, missing, huge = kernel(20, 5), kernel(30, 5), kernel(40, 5), kernel(50, 5)
    late["ts"], huge["ts"] = "late", 1e300
    del missing["ts"]
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps({"traceEvents": [good, late, nan, missing, huge]}).replace('"ts": 30', '"ts": NaN')
    )
    for loaded in (load_trace(path), load_trace_reference(path)):
        assert loaded.gpu.height == 1
        assert loaded.meta.load_notes == (("dropped-time", 4),)
    assert load_trace(write_trace(tmp_path / "clean.json", [good])).meta.load_notes == ()


# --- torch's unescaped frame names ---------------------------------------------------------------

QUOTED_NAME = Path(__file__).parent / "data" / "torch_quoted_frame_name.pt.trace.json.gz"


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_torch_trace_with_an_unescaped_frame_name_is_repaired(
    native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture is torch 2.13's own export (tests/data/make_quoted_frame_name_trace.py): a frame
    named like a docstring line makes it invalid JSON; the loader mends that one name and says so."""
    from traceinsight.load.repair import repair_names

    raw = gzip.decompress(QUOTED_NAME.read_bytes())
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    mended, count = repair_names(raw)
    expected = [e for e in json.loads(mended)["traceEvents"] if e.get("ph") == "X"]
    quoted = [e for e in expected if e.get("cat") == "python_function" and e["name"].endswith('    """')]
    assert count == len(quoted) >= 1  # the three calls of the quoted function
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    trace = load_trace(QUOTED_NAME)
    assert ("repaired-name", count) in trace.meta.load_notes
    assert trace.python.height == sum(1 for e in expected if e.get("cat") == "python_function")
    assert trace.cpu_ops.height == sum(1 for e in expected if e.get("cat") == "cpu_op")
    assert sum(name.endswith('    """') for name in trace.python["name"].to_list()) == len(quoted)


def _kineto_layout(names: list[str], *, raw: bool, raw_backslashes: bool = False) -> bytes:
    """A trace in torch's own layout (one key per line); each name JSON-escaped, or with
    ``raw`` written as torch wrote frame names: quotes and newlines as they are (a name with a
    backslash is escaped, as a JSON writer writes it, unless ``raw_backslashes``: as kinetos
    that leave backslashes alone write it)."""
    written = [
        '"' + name + '"'
        if raw and (raw_backslashes or "\\" not in name)
        else json.dumps(name, ensure_ascii=False)
        for name in names
    ]
    events = [
        '  {\n    "ph": "X",\n    "cat": "python_function",\n'
        f'    "name": {name},\n    "pid": 1,\n    "tid": 1,\n    "ts": {10 * i},\n    "dur": 5\n  }}'
        for i, name in enumerate(written)
    ]
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join(events) + "\n  ]\n}\n").encode()


#: Two names torch's layout breaks (a bare quote, a split line); one it writes well that ends in an
#: escaped backslash (its closing quote follows a backslash, yet is not escaped).
MENDED_NAMES = [
    "ünïcödé" * 40 + ".py(3): f",
    'quoted.py(6):     """',
    "C:\\dir\\",
    "split.py(1): a\nb\nc",
    "g",
]


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("form", ["plain", "byte-order-mark", "gzip", "NaN-first"])
def test_names_torch_left_unescaped_or_split_are_repaired_like_the_escaped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str, form: str
) -> None:
    """A bare quote and a name split over lines (kinetos before 2023) after non-ASCII text (the
    loader finds the bad line by its byte offset, which each parser gives its own way; a NaN
    first leaves the file to Python's json): the tables are the reference's tables of the same
    trace written with the names escaped."""
    from traceinsight.load.schema import TABLES

    def written(name: str, text: bytes) -> Path:
        text = b"\xef\xbb\xbf" + text if form == "byte-order-mark" else text
        text = text.replace(b'"dur": 5', b'"dur": NaN', 1) if form == "NaN-first" else text
        path = tmp_path / (name + (".json.gz" if form == "gzip" else ".json"))
        path.write_bytes(gzip.compress(text) if form == "gzip" else text)
        return path

    broken = _kineto_layout(MENDED_NAMES, raw=True)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    trace = load_trace(written("broken", broken))
    expected = load_trace_reference(written("escaped", _kineto_layout(MENDED_NAMES, raw=False)))
    assert trace.meta.load_notes == (*expected.meta.load_notes, ("repaired-name", 2))
    for table in TABLES:
        assert getattr(trace, table).equals(getattr(expected, table)), table
    assert trace.python.height == len(MENDED_NAMES)


#: Names written with their backslashes as they are (kinetos before the one in torch 2.13 on
#: Linux), each with a backslash that starts no JSON escape or ends the name, so that the repair
#: can tell it was written raw; then every backslash is the name's own, also those that look like
#: an escape (\n, \t, \\, \", \u00e9): a JSON writer's text is the reference. A last quote after
#: an odd number of backslashes ends the name when the event's next key follows.
RAW_BACKSLASH_NAMES = [
    "C:\\dir\\",
    "a.py(1): f",
    "x\\y.py(2): z",
    "trailing\\",
    'q"\\',
    "b.py(3): g",
    "C:\\Users\\me\\torch\\nn\\mod.py(1): f",
    "a\\\\\\b\\",
    'a\\"b\\',
    "x\\u00e9\\d",
]


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_name_with_backslashes_left_as_they_are_is_mended_not_joined_with_the_next_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    """Was: ``"name": "trailing\\",`` was joined with the lines after it up to the next event's
    ``"ph": "X",`` and loaded without that event, with only a repaired-name note; a backslash
    that starts no escape (``x\\y``) left the file unreadable; and in a name it mended, the
    ``\\n`` and ``\\t`` of a path were read as a newline and a tab."""
    from traceinsight.load.repair import mended_blocks, repair_names
    from traceinsight.load.schema import TABLES

    broken = _kineto_layout(RAW_BACKSLASH_NAMES, raw=True, raw_backslashes=True)
    escaped = _kineto_layout(RAW_BACKSLASH_NAMES, raw=False)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    repaired = len(RAW_BACKSLASH_NAMES) - 2  # all but the two plain names
    assert repair_names(broken) == (escaped, repaired)
    for block in (1, 3, 64):
        count = [0]
        blocks = (broken[at : at + block] for at in range(0, len(broken), block))
        assert b"".join(mended_blocks(blocks, count)) == escaped and count == [repaired]
    (tmp_path / "broken.json").write_bytes(broken)
    (tmp_path / "escaped.json").write_bytes(escaped)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    trace = load_trace(tmp_path / "broken.json")
    expected = load_trace_reference(tmp_path / "escaped.json")
    assert trace.meta.load_notes == (*expected.meta.load_notes, ("repaired-name", repaired))
    for table in TABLES:
        assert getattr(trace, table).equals(getattr(expected, table)), table
    assert trace.python["name"].to_list() == RAW_BACKSLASH_NAMES


def test_a_name_line_near_the_hold_limit_is_mended_alike_cut_anywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name line of about :data:`HOLD_BYTES` (here 64), cut in two at every byte: the stream
    mends it as the whole text does (was: the stream measured the line from its start, the whole
    text from the name's text, so a line just over the limit with a quote at the cut went out
    unmended in the stream only)."""
    from traceinsight.load import repair

    monkeypatch.setattr(repair, "HOLD_BYTES", 64)
    for length in range(40, 70):
        for quote in range(length - 16, length):
            body = bytearray(b"a" * length)
            body[quote] = ord('"')
            text = b'  {\n    "name": "' + bytes(body) + b'",\n    "pid": 1,\n  }\n'
            whole = repair.repair_names(text)
            for cut in range(1, len(text)):
                count = [0]
                streamed = b"".join(repair.mended_blocks([text[:cut], text[cut:]], count))
                assert (streamed, count[0]) == whole, (length, quote, cut)


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_name_that_never_closes_is_not_joined_with_the_keys_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    """A name line cut short of its quote: not a name the repair can mend, so the file is refused
    (was: joined with its event's keys up to the next event's ``"ph": "X",``, which closes a
    string, and loaded one event short)."""
    from traceinsight.errors import TraceFormatError
    from traceinsight.load.repair import repair_names

    broken = _kineto_layout(["a", "b", "c"], raw=True).replace(b'"name": "b",', b'"name": "b', 1)
    assert repair_names(broken) == (broken, 0)
    (tmp_path / "broken.json").write_bytes(broken)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_trace(tmp_path / "broken.json")


@pytest.mark.parametrize("block", [1, 2, 7, 64, 1 << 20])
def test_names_mended_in_blocks_of_any_size_are_the_json_writers_escapes(block: int) -> None:
    """The repair streams: its text, in blocks of any size, is byte for byte what Python's json
    writes for the same names (quotes as ``\\"``, newlines as ``\\n``, a well-formed name left alone);
    and a stream of it reads the same again after a seek to its start."""
    from traceinsight.load.repair import MendedText, mended_blocks

    broken = _kineto_layout(MENDED_NAMES * 3, raw=True)
    count = [0]
    mended = b"".join(mended_blocks((broken[at : at + block] for at in range(0, len(broken), block)), count))
    assert mended == _kineto_layout(MENDED_NAMES * 3, raw=False)
    assert count == [6]
    stream = MendedText(lambda: (broken[at : at + block] for at in range(0, len(broken), block)))
    pieces = list(iter(lambda: stream.read(5), b""))
    assert b"".join(pieces) == mended and stream.repaired == 6
    assert stream.seek(0) == 0 and stream.read() == mended and stream.repaired == 6


@pytest.mark.parametrize("block", [7, 64])
def test_the_repair_holds_back_a_bounded_text_past_a_long_line(
    monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """A line far longer than the text the repair may hold back (an argument of 5,000 bytes,
    held back at most 256): the names before and after it are mended as the json writer writes
    them, and no piece handed on is much longer than what may be held."""
    from traceinsight.load import repair

    monkeypatch.setattr(repair, "HOLD_BYTES", 256)
    long_line = b'"dur": 5,\n    "args": {"long": "' + b"a" * 5000 + b'"}'

    def with_long_line(text: bytes) -> bytes:
        at = text.index(b'"dur": 5', text.index(b"split.py"))
        return text[:at] + long_line + text[at + len(b'"dur": 5') :]

    broken = with_long_line(_kineto_layout(MENDED_NAMES * 2, raw=True))
    count = [0]
    pieces = list(
        repair.mended_blocks((broken[at : at + block] for at in range(0, len(broken), block)), count)
    )
    assert b"".join(pieces) == with_long_line(_kineto_layout(MENDED_NAMES * 2, raw=False))
    assert count == [4]
    assert max(map(len, pieces)) < 256 + block + 1000
    # a split name whose lines run into a long one is left alone, in any blocks as in one text
    near = b'    "name": "split.py(1): a\nb"c",\n' + b"    " + b"x" * 300 + b"\n" + broken
    near = near.replace(b'"split.py(1): a\nb\nc",', b'"split.py(1): a\nb\n' + b"c" * 300 + b'",', 1)
    whole = repair.repair_names(near)
    for size in (1, 5, block, 100, 300):
        count = [0]
        assert (
            b"".join(repair.mended_blocks((near[at : at + size] for at in range(0, len(near), size)), count)),
            count[0],
        ) == whole
    assert whole[1] == 4  # all but the split name whose last line has 300 bytes
    assert b'"split.py(1): a\nb\n' + b"c" * 300 + b'",' in whole[0]


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_file_cut_short_is_never_read_again_to_repair_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    """A cut at every byte of a name line, at the start of every line and inside the top-level
    fields: one line, and the whole text is never read again to repair names
    (which would read all of it again). The file holds a name the repair would mend, last."""
    import traceinsight.load.loader as load_module
    from traceinsight.errors import TraceFormatError

    def never(*args: object) -> tuple[object, ...]:
        raise AssertionError("read again to repair")

    text = _kineto_layout([*MENDED_NAMES[:3], "h"], raw=False) + b" " * 10
    text = text.replace(json.dumps(MENDED_NAMES[1]).encode(), f'"{MENDED_NAMES[1]}"'.encode())
    first_name = text.index(b'    "name"')
    cuts = [
        *range(first_name, text.index(b"\n", first_name) + 1),
        *(i + 1 for i, c in enumerate(text) if c == 10),
    ]
    cuts = [cut for cut in cuts if cut < text.index(b"quoted.py")] + [5, 20]
    monkeypatch.setattr(load_module, "_load_mended", never)
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    path = tmp_path / "cut.json"
    for cut in cuts:
        path.write_bytes(text[:cut])
        with pytest.raises(TraceFormatError, match=r"not valid JSON|ends before|the file is empty"):
            load_trace(path)
    path.write_bytes(text)
    with pytest.raises(AssertionError, match="read again"):
        load_trace(path)  # the yardstick: the mendable name is read again


# ------------------------------------------------------------------------- gunzip, any inflater --


def _gunzipped(path: Path, block: int) -> bytes:
    with open_trace(path) as source:
        return b"".join(source.blocks(block))


@pytest.mark.parametrize("inflater", ["default", "zlib"])
def test_gunzip_gives_the_bytes_python_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inflater: str
) -> None:
    """The streamed text of every gzip sample, of several members and of zero padding after the
    last, is what the standard library's ``gzip.decompress`` gives (the reference loader streams
    through the same inflater, so it cannot be the yardstick here); with ISA-L's inflater (the
    default where its wheel exists) and with zlib's, the fallback."""
    if inflater == "zlib":
        monkeypatch.setattr(source_module, "_inflate", zlib)
    samples = sorted(SAMPLES.rglob("*.json.gz"))
    assert len(samples) >= 10
    for path in samples:
        assert _gunzipped(path, 1 << 20) == gzip.decompress(path.read_bytes()), path.name
    members = tmp_path / "members.json.gz"
    parts = [
        b'{"traceEvents": [',
        b'{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}' * 500,
        b"]}",
    ]
    members.write_bytes(b"".join(gzip.compress(part, mtime=0) for part in parts) + b"\0" * 4096)
    assert _gunzipped(members, 1000) == b"".join(parts)


@pytest.mark.parametrize("inflater", ["default", "zlib"])
def test_corrupt_gzip_is_one_line_with_any_inflater(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inflater: str
) -> None:
    if inflater == "zlib":
        monkeypatch.setattr(source_module, "_inflate", zlib)
    data = bytearray(gzip.compress(b'{"traceEvents": [' + b'{"ph": "X", "ts": 1},' * 5000 + b"{}]}", mtime=0))
    data[len(data) // 2] ^= 0xFF  # a flipped byte in the deflate data (or a wrong checksum)
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceUnreadable, match=r"^cannot read trace .*: corrupt gzip data \("):
        load_trace(path)


def test_isal_inflates_where_it_is_installed() -> None:
    """ISA-L inflates gzip 2.9-3.3x as fast as zlib on the benchmark's traces (0.30 s against 0.91 s
    for 500 MB of DDP JSON); the package depends on it where a wheel exists."""
    pytest.importorskip("isal")
    assert source_module._inflate.__name__ == "isal.isal_zlib"
