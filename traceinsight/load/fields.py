"""The event fields every loader reads, declared once (polars-free, so that the C scanner can be
configured before polars loads: :mod:`.scanner`); :mod:`.schema` declares the tables made of them.
"""

from __future__ import annotations

from typing import Final, Literal

from traceinsight.model import Model

__all__ = ["EVENT_FIELDS", "EventField"]


class EventField(Model, frozen=True):
    """One field of a trace event that the tables read."""

    name: str
    """The field's name in the loader (a column of the tables, or the source of one)."""
    key: str
    """Its JSON key."""
    in_args: bool
    """Whether it sits in the event's ``args`` object."""
    kind: Literal["category", "name", "text", "id", "time", "json"]
    """How a value is read: ``category`` a string or "" (routes the event to its table), ``name``
    a string or the value's ``str``, ``text`` a string or null, ``id`` :func:`.coerce.as_int`,
    ``time`` µs to ns by :func:`.coerce.as_ns`, ``json`` a list or object as its compact JSON text
    (:func:`.coerce.as_json_text`; anything else null)."""
    memory: bool = False
    """Read only from ``[memory]`` instant events (:data:`MEMORY_EVENTS`), never from X events."""


#: The fields every loader reads (the C scanner is configured with this list at import, and the
#: msgspec structs of the pure-Python loader are made from it).
EVENT_FIELDS: Final[tuple[EventField, ...]] = (
    EventField("cat", "cat", False, "category"),
    EventField("name", "name", False, "name"),
    EventField("pid", "pid", False, "id"),
    EventField("tid", "tid", False, "id"),
    EventField("ts", "ts", False, "time"),
    EventField("dur", "dur", False, "time"),
    EventField("external_id", "External id", True, "id"),
    EventField("external_id_legacy", "external id", True, "id"),  # 2021 traces
    EventField("correlation", "correlation", True, "id"),
    EventField("device", "device", True, "id"),
    EventField("stream", "stream", True, "id"),
    EventField("bytes", "bytes", True, "id"),
    EventField("python_id", "Python id", True, "id"),
    EventField("python_parent_id", "Python parent id", True, "id"),
    # ``traceinsight run``'s own frames: 1 named by the call's line, 0 by the function's first line.
    EventField("call_site", "Call site", True, "id"),
    EventField("call_stack", "Call stack", True, "text"),  # 2020-21 traces
    # A collective's sequence number in its process group and the group's name, on communication
    # kernels since 2026 (kineto PRs 1296, 1483): what matches a collective across ranks.
    EventField("seq", "Seq", True, "id"),
    EventField("process_group", "Process Group Name", True, "text"),
    # An operator's recorded shapes (``record_shapes=True``): its inputs' dims, dtypes and the values
    # of its scalar and list inputs (stride, padding, ...), for the FLOP count (analysis.flops).
    EventField("input_dims", "Input Dims", True, "json"),
    EventField("input_types", "Input type", True, "json"),
    EventField("concrete_inputs", "Concrete Inputs", True, "json"),
    # torch's own FLOP count of an operator (``with_flops=True``).
    EventField("flops", "flops", True, "id"),
    # autograd's sequence number of an operator (``record_shapes`` / any 2.x trace): a backward
    # operator carries its forward operator's, and ``Fwd thread id`` > 0 (0 on forward operators):
    # what links backward time to the forward module (analysis.modules).
    EventField("sequence_number", "Sequence number", True, "id"),
    EventField("fwd_thread_id", "Fwd thread id", True, "id"),
    # The allocator's records (``profile_memory=True``); the totals since torch 1.10.
    EventField("device_type", "Device Type", True, "id", memory=True),
    EventField("device_id", "Device Id", True, "id", memory=True),
    EventField("alloc_bytes", "Bytes", True, "id", memory=True),
    EventField("total_allocated", "Total Allocated", True, "id", memory=True),
    EventField("total_reserved", "Total Reserved", True, "id", memory=True),
)
