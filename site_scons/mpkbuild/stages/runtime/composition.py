"""The worker a verdict is measured in (issue 59 item 2).

Every task compiled into MPK's worker moves the code the worker runs for each of them: its
registers, its stack, the layout of its one big dispatch (bench/RESULTS.md sections 16, 22).
A production worker holds the calls its model's builder registers, whether or not a given
graph runs them. So by default the gate's megakernel holds them too: the calls the
checkout's qwen3 builder registers for a decode step on Hopper (read from the checkout's
register functions, as the incumbents' are), ours in place of the task of our op, never
run. `runtime.composition: minimal` leaves only the graphs' own tasks.

Standard library only (the build side).
"""
from __future__ import annotations

from mpkbuild.wire import incumbents as inc

# Qwen3-8B at the decode configuration the gate's build is made for (megakernel.MODE_MACROS:
# 8 batched tokens, 64-token pages); its vocab padded as the builder pads it (153600),
# argmax over MPK's worker count at 132-159 SMs
QWEN3_8B = {"model": "qwen3", "hidden": 4096, "intermediate": 12288, "q_heads": 32,
            "kv_heads": 8, "head_dim": 128, "vocab": 153600, "batch": 8,
            "max_seq_len": 4096, "page_size": 64, "workers": 128}
SIZES = tuple(k for k in QWEN3_8B if k != "model")


def declared(spec: dict) -> dict | None:
    """The model whose worker the gate builds (QWEN3_8B with the spec's sizes), or None
    for the minimal composition."""
    value = spec.get("runtime", {}).get("composition", "production")
    if value == "minimal":
        return None
    return dict(QWEN3_8B) if value == "production" else {**QWEN3_8B, **value}


def describe(model: dict | None, runtime: str = "v1") -> str:
    if runtime != "v1":
        return "minimal (the graphs' own tasks; Runtime-V2 has no model builder task set here)"
    if model is None:
        return "minimal (the graphs' own tasks, runtime.composition: minimal)"
    m = model
    return (f"production-shaped: the {m['model']} builder's decode tasks on Hopper (batch "
            f"{m['batch']}, hidden {m['hidden']}, intermediate {m['intermediate']}, "
            f"{m['q_heads']}/{m['kv_heads']} heads of {m['head_dim']}, vocab {m['vocab']}) "
            "compiled in beside ours, ours in place of the task of its op")


def _paged_attention(m: dict) -> list:
    """register_paged_attention_hopper_task's values for the builder's paged_attention_layer:
    per request and kv head a task; qk-norm and rotary on."""
    hd, q, kv = m["head_dim"], m["q_heads"], m["kv_heads"]
    qkv_stride = (q + 2 * kv) * hd
    return [q // kv, 1, kv, hd * kv, qkv_stride, q * hd, hd, -1, m["max_seq_len"],
            m["page_size"], m["batch"], "false", 1, "true", "true"]


# tasks the builder registers that no incumbent of the table stands for: (the name graph.cc
# gives it, its register function, the CodeKeeper lines of the branch it does not take,
# its task type, its headers)
_PAGED_ATTENTION = ("paged_attention_hopper", "register_paged_attention_hopper_task", (),
                    "TASK_PAGED_ATTENTION_HOPPER", ("tasks/hopper/multitoken_paged_attention_hopper.cuh",))


def qwen3_layers(m: dict) -> list[tuple[str, str, object]]:
    """(layer, op, what registers it) of one decode step as models/qwen3/builder.py
    builds it on sm_90 with one GPU: an incumbent's name with its shapes and params, or a
    (register, skip, task type, headers) entry with its values. The same call twice (the
    layers repeat) is one dispatch branch."""
    b, h, inter = m["batch"], m["hidden"], m["intermediate"]
    qkv = (m["q_heads"] + 2 * m["kv_heads"]) * m["head_dim"]
    linear = lambda n, k: ("linear_swapAB_hopper", {"inputs": [[b, k], [n, k]]}, {})
    # o_proj and down_proj: the residual added in the epilogue, hidden // 64 output slices
    residual = lambda k: ("linear_swapAB_with_residual_hopper", {"inputs": [[b, k], [h, k], [b, h]]},
                          {"tasks": h // 64})
    return [
        ("embed_tokens", "embedding", ("embedding", {"inputs": [[b], [m["vocab"], h]]}, {})),
        ("input_layernorm", "rmsnorm", ("rmsnorm_hopper", {"inputs": [[b, h], [h]]}, {})),
        ("qkv_proj", "linear", linear(qkv, h)),
        ("attention", "paged_attention", (_PAGED_ATTENTION, _paged_attention(m))),
        ("o_proj", "linear_with_residual", residual(m["q_heads"] * m["head_dim"])),
        ("gate_up_proj", "linear", linear(2 * inter, h)),
        ("silu_mul", "silu_mul", ("silu_mul", {"inputs": [[b, 2 * inter]]}, {})),
        ("down_proj", "linear_with_residual", residual(inter)),
        ("lm_head", "linear", linear(m["vocab"], h)),
        ("argmax", "argmax", ("argmax_hopper", {"inputs": [[b, m["vocab"]]]}, {"tasks": m["workers"]})),
    ]


def problems(model: dict | None):
    """What keeps the model's tasks from being made at its sizes (no checkout needed)."""
    if model is None:
        return
    if model["q_heads"] % model["kv_heads"]:
        yield f"q_heads {model['q_heads']} is not a multiple of kv_heads {model['kv_heads']}"
    for layer, _, (what, *rest) in qwen3_layers(model):
        if isinstance(what, str):
            try:
                inc.LAYOUTS[what](*rest)
            except inc.NoIncumbent as exc:
                yield f"the {model['model']} layer {layer} ({what}): {exc}"


def production_calls(model: dict | None, ops: set[str], text: str | None,
                     first_id: int) -> tuple[list[dict], list[str]]:
    """(dispatch entries, task headers) of the model's tasks whose op none of `ops` (ours and
    the block's kernels) stands in for, ids from `first_id`; raises NoIncumbent where the
    checkout's register text does not take the values (the composition cannot be made)."""
    if model is None:
        return [], []
    if text is None:
        raise inc.NoIncumbent(f"the checkout has no {inc.REGISTER_FILE}")
    out, headers = [], []
    for layer, op, (what, *rest) in qwen3_layers(model):
        if op in ops:
            continue
        if isinstance(what, str):
            shapes, params = rest
            calls = inc.task_calls(what, shapes, params, text)
            headers += inc.TABLE[what].headers
            name = what
        else:
            (name, register, skip, task_type, hdrs), values = what, rest[0]
            call, task_type = inc.call_lines(text, register, values, skip, task_type)
            calls = [{"register": register, "call": call, "task_type": task_type}]
            headers += hdrs
        for c in calls:
            out.append({"id": first_id + len(out), "kernel": name, "variant": f"{model['model']} {layer}",
                        "register": c["register"], "task_type": c["task_type"], "call": c["call"],
                        "spec": None, "filler": True})
    return out, list(dict.fromkeys(headers))
