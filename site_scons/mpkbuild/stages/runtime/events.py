"""The events between two layers of a graph, made by the rule MPK's compile uses
(src/kernel/annotated_graph.cc, runtime.cc of the checkout): along each dimension of the
tensor one layer writes and the next reads, gcd(the producer's parts, the consumer's parts)
events, so a consumer task waits for the producer tasks that write its slice, not for the
whole layer. In MPK's decode step that is 32 events between the gate|up projection's 64
tasks and silu_mul's 32 tiles; a chain given one event per layer instead is slower than the
one MPK builds (issue 58). Each side of a head to head gets the events its own tasks' tiles
make: a layer that reads the whole tensor in every task still waits for the whole layer.
As in the checkout's iteration, these events launch nothing: every task is handed out at the
graph's start and a consumer task waits at its worker for its event's counter
(templates/megakernel.cu.j2).

A task's tile is read off its layer's per-task byte strides (the runner lays tasks out by
them), as MPK reads it off a layer's grid and maps: the tiles of a layer are equal boxes
that cover the tensor, or the layer is treated as reading all of it.
"""
from __future__ import annotations

import math

def _tiles(layer: dict, tensor: int, shape: list[int], dtype_bytes: int):
    """Per task of the layer, its box (row0, col0) and the box's (rows, cols) of the
    tensor viewed as [rows, cols] (leading dimensions folded into rows); None where the
    strides do not make equal boxes that cover it."""
    rows, cols = math.prod(shape[:-1]), shape[-1]
    pos = layer["tensors"].index(tensor)
    gx = layer["grid_x"]
    gy = layer["tasks"] // gx
    extent = {"rows": rows, "cols": cols}
    for stride, count in ((layer["strides"][pos], gx), (layer["strides_y"][pos], gy)):
        if stride == 0 or count == 1:
            continue                           # every task of this axis sees the whole extent
        row_bytes = cols * dtype_bytes
        if stride % row_bytes == 0 and (stride // row_bytes) * count == rows:
            extent["rows"] = stride // row_bytes
        elif stride < row_bytes and stride % dtype_bytes == 0 and stride // dtype_bytes * count == cols:
            extent["cols"] = stride // dtype_bytes
        else:
            return None
    boxes = []
    for t in range(layer["tasks"]):
        at = (layer["strides"][pos] * (t % gx) + layer["strides_y"][pos] * (t // gx)) // dtype_bytes
        boxes.append(divmod(at, cols))
    return boxes, (extent["rows"], extent["cols"]), (rows, cols)


def between(producer: dict, consumer: dict, tensor: int, shape: list[int],
            dtype_bytes: int) -> dict | None:
    """The events after `producer` (a plan layer) whose output `tensor` (its graph index,
    `shape`) `consumer` reads: {"event_of": per producer task its event, "order": the
    consumer's tasks in launch order, "launches": per event how many of them it launches},
    or None for one event after the whole layer."""
    if tensor not in producer["tensors"][producer["num_inputs"]:] or tensor not in consumer["tensors"]:
        return None
    made, read = _tiles(producer, tensor, shape, dtype_bytes), _tiles(consumer, tensor, shape, dtype_bytes)
    if made is None or read is None:
        return None
    (p_at, p_box, whole), (c_at, c_box, _) = made, read
    # per dimension: gcd of the parts each side cuts it into; an event's slice is whole / that
    parts = [math.gcd(whole[d] // p_box[d], whole[d] // c_box[d]) for d in (0, 1)]
    if parts == [1, 1]:
        return None
    slab = [whole[d] // parts[d] for d in (0, 1)]

    def event(at):
        return (at[0] // slab[0]) * parts[1] + at[1] // slab[1]

    event_of = [event(at) for at in p_at]
    of_consumer = [event(at) for at in c_at]
    order = sorted(range(len(c_at)), key=lambda t: (of_consumer[t], t))
    launches = [of_consumer.count(e) for e in range(parts[0] * parts[1])]
    if 0 in launches or len(set(event_of)) != len(launches):
        return None                            # an event no task would trigger or none waits on
    return {"event_of": event_of, "order": order, "launches": launches}
