"""Make large benchmark traces by repeating a real sample trace end to end.

Each copy of the sample's events is shifted in time past the end of the previous copy (plus a 1 ms
gap) and has every id offset so that ids stay unique across copies: ``External id``/``external id``,
``correlation``, flow ``id``, ``Python id``/``Python parent id``; its ``ProfilerStep#N`` ranges (host
and GPU rows) are numbered on from the copy before, so a long trace holds as many steps as a run
that long would (every copy repeating ``ProfilerStep#101``-``#105`` left the analysis five steps,
all in the first copy, and the rest outside every step). The top-level object (device
properties, distributed info, base time, logs) is written once, in the sample's key order, and the
events in Kineto's own layout (each event starts on a line ``  {``), so the result looks like what
torch.profiler writes for a longer run.

The benchmark's shapes (:data:`SHAPES`) are real samples of different kinds of run: DDP training
with many short gaps, recsys with thousands of copies, LLM decode with ~10^5 tiny kernels and
Python stacks, and a ResNet-50 step with its DataLoader in the main process.

Usage::

    python benchmarks/make_large_trace.py --size-gb 0.5 [--gzip] [--shape a100_recsys_rank0]
    python benchmarks/make_large_trace.py --size-gb 0.5 --source sample_traces/x.json.gz

Files land in ``benchmarks/data/`` (git-ignored) as ``<source stem>.x<size>GB.json[.gz]``; an
existing file is reused.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
DEFAULT_SOURCE = ROOT / "sample_traces" / "v100_ddp_ns_timestamps.pt.trace.json.gz"

#: Benchmark shapes: name → the real sample that is repeated.
SHAPES = {
    "v100_ddp_ns_timestamps": DEFAULT_SOURCE,
    "a100_recsys_rank0": ROOT / "sample_traces" / "a100_recsys_rank0.json.gz",
    "b200_eager_stacks": ROOT / "sample_traces" / "b200_eager_stacks.json.gz",
    "h100_qwen_inference_stacks": ROOT / "sample_traces" / "h100_qwen_inference_stacks.json.gz",
    "v100_resnet50_workers0": ROOT / "sample_traces" / "v100_resnet50_workers0.pt.trace.json.gz",
}

_ID_ARGS = ("External id", "external id", "correlation", "Python id", "Python parent id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _step_numbers(events: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(first, last) ``ProfilerStep#N`` number of the sample, None without steps."""
    numbers = [int(m[1]) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    return (min(numbers), max(numbers)) if numbers else None


def _load(source: Path) -> Any:
    raw = source.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _stem(source: Path) -> str:
    name = source.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def _span_and_max_id(events: list[dict[str, Any]]) -> tuple[float, float, int]:
    """(first ts, last end, largest id) over the sample's events."""
    first, last, top = float("inf"), float("-inf"), 0
    for event in events:
        ts = event.get("ts")
        if isinstance(ts, int | float) and not isinstance(ts, bool):
            first = min(first, ts)
            dur = event.get("dur")
            last = max(last, ts + (dur if isinstance(dur, int | float) else 0))
        value = event.get("id")
        if type(value) is int:
            top = max(top, value)
        args = event.get("args")
        if isinstance(args, dict):
            for key in _ID_ARGS:
                value = args.get(key)
                if type(value) is int:
                    top = max(top, value)
    return first, last, top


def _shifted(
    event: dict[str, Any], dt: float, id_offset: int, float_time: bool, step_offset: int = 0
) -> dict[str, Any]:
    if not id_offset:
        return event
    out = dict(event)
    step = _STEP.match(str(out.get("name", ""))) if step_offset else None
    if step is not None:
        out["name"] = f"ProfilerStep#{int(step[1]) + step_offset}"
    ts = out.get("ts")
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        # Float-time traces keep a nanosecond fraction: round to it as Kineto does.
        out["ts"] = round(ts + dt, 3) if float_time else ts + int(dt)
    if type(out.get("id")) is int:
        out["id"] += id_offset
    args = out.get("args")
    if isinstance(args, dict):
        new_args = dict(args)
        for key in _ID_ARGS:
            if type(new_args.get(key)) is int and new_args[key] >= 0:
                new_args[key] += id_offset
        out["args"] = new_args
    return out


def _event_text(event: dict[str, Any]) -> str:
    body = json.dumps(event, separators=(", ", ": "), ensure_ascii=False)
    return "  {\n    " + body[1:-1] + "\n  }"


def make_trace(source: Path, size_bytes: int, target: Path) -> Path:
    """Write ``target``: ``source`` repeated until the JSON reaches ``size_bytes``; return it."""
    document = _load(source)
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise SystemExit(f"{source}: need a trace object with traceEvents")
    events: list[dict[str, Any]] = [e for e in document["traceEvents"] if isinstance(e, dict)]
    first, last, top = _span_and_max_id(events)
    float_time = any(type(e.get("ts")) is float for e in events[:1000])
    period = (last - first) + 1000.0  # µs: one copy, then a 1 ms gap
    id_step = 10 ** len(str(top + 1))  # ids read as copy * 10^k + original
    steps = _step_numbers(events)
    steps_per_copy = 0 if steps is None else steps[1] - steps[0] + 1
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(target.suffix + ".tmp")
    written = 0
    with temporary.open("w", encoding="utf-8") as out:
        header_keys = list(document)
        split = header_keys.index("traceEvents")
        head = "{\n" + "".join(
            f"  {json.dumps(k)}: {json.dumps(document[k])},\n" for k in header_keys[:split]
        )
        tail_keys = header_keys[split + 1 :]
        tail = "".join(f",\n  {json.dumps(k)}: {json.dumps(document[k])}" for k in tail_keys) + "\n}\n"
        written += out.write(head + '  "traceEvents": [\n')
        copy = 0
        separator = ""
        while written + len(tail) < size_bytes:
            dt = copy * period
            for event in events:
                # Metadata rows (ph "M") name processes and threads again; repeating them is harmless.
                shifted = _shifted(event, dt, copy * id_step, float_time, copy * steps_per_copy)
                written += out.write(separator + _event_text(shifted))
                separator = ",\n"
                if written + len(tail) >= size_bytes:
                    break
            copy += 1
            print(f"  copy {copy}: {written / 1e6:.0f} MB", file=sys.stderr, end="\r")
        written += out.write("\n  ]" + tail)
    print(file=sys.stderr)
    temporary.replace(target)
    return target


def ensure_trace(size_gb: float, compress: bool, source: Path = DEFAULT_SOURCE) -> Path:
    """The benchmark trace for this size (made once, then reused), plain or gzip (level 6)."""
    plain = DATA / f"{_stem(source)}.x{size_gb:g}GB.json"
    if not plain.exists():
        print(f"making {plain.name} ...", file=sys.stderr)
        make_trace(source, int(size_gb * 1e9), plain)
    if not compress:
        return plain
    packed = plain.with_suffix(".json.gz")
    if not packed.exists():
        print(f"compressing {packed.name} ...", file=sys.stderr)
        temporary = packed.with_suffix(".gz.tmp")
        with plain.open("rb") as src, gzip.open(temporary, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        temporary.replace(packed)
    return packed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, action="append", help="target size(s) in GB (1e9 bytes)")
    parser.add_argument("--gzip", action="store_true", help="also write the gzip twin")
    sources = parser.add_mutually_exclusive_group()
    sources.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to repeat")
    sources.add_argument("--shape", choices=sorted(SHAPES), help="a benchmark shape (its sample)")
    options = parser.parse_args()
    source = SHAPES[options.shape] if options.shape else options.source
    for size in options.size_gb or [0.1]:
        print(ensure_trace(size, options.gzip, source))


if __name__ == "__main__":
    main()
