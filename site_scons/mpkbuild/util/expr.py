"""Integer expressions in specs (`threads * vec_elems`, `(2 * rows * hidden + hidden) * 2`).

Only names, integer/float literals, + - * // / %, parentheses and the two functions
min(a, b, ...) and max(a, b, ...) are allowed: a spec is data, never code, so nothing here
calls eval on user text. There is no `**` (`9 ** 9 ** 9` would never finish) and an
expression is at most MAX_CHARS long, so every evaluation is bounded in time and memory;
arithmetic faults (division by zero, a float overflow) are ExprErrors, not tracebacks.
"""
from __future__ import annotations

import ast
import functools
import math
import operator

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod,
}
MAX_CHARS = 200             # the catalog's longest is 60; also keeps the parser's recursion shallow
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


_FUNCS = {"min": min, "max": max}


class ExprError(ValueError):
    """An expression that does not parse, names a symbol that is not bound, or faults."""


def _parse(text) -> ast.Expression:
    return _parse_cached(str(text))


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ast.Expression:
    """Parsed once per text (the tune space evaluates the same few hundred times); the
    trees are only read, never changed."""
    if len(text) > MAX_CHARS:
        raise ExprError(f"expression is {len(text)} characters long (at most {MAX_CHARS})")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExprError(f"cannot parse expression {text!r}: {getattr(exc, 'msg', exc)}") from None


def evaluate(text: str | int | float, symbols: dict[str, int | float], cpp_int: bool = False):
    """Evaluate an expression (or pass a number through) with the given symbol values.

    cpp_int: the expression is also emitted as C++ `int` arithmetic (to_cpp), so every
    intermediate must be an int32 and // and % must not meet a negative operand (C++
    truncates where Python floors)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return text
    tree = _parse(text)

    def checked(value):
        if cpp_int and (not isinstance(value, int) or not INT32_MIN <= value <= INT32_MAX):
            raise ExprError(f"{text!r}: an intermediate value {value!r} is not a C++ int "
                            f"(the expression is compiled as int arithmetic)")
        return value

    def binop(node):
        left, right = ev(node.left), ev(node.right)
        if cpp_int and isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Div)) and (left < 0 or right < 0):
            raise ExprError(f"{text!r}: // and % of a negative number differ between Python and C++")
        try:
            return checked(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {text!r}") from None
        except ArithmeticError as exc:      # OverflowError: an int too large for a float
            raise ExprError(f"{text!r} overflows: {exc}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise ExprError(f"{text!r}: literal {node.value} is not a finite number")
            return checked(node.value)
        if isinstance(node, ast.Name):
            if node.id not in symbols:
                raise ExprError(f"unknown symbol {node.id!r} in {text!r} "
                                f"(known: {', '.join(sorted(symbols)) or 'none'})")
            return checked(symbols[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return binop(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            raise ExprError(f"`**` is not supported in {text!r} (write the product out)")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return checked(-v) if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call):
            return _FUNCS[_call_name(node, text)](*(ev(a) for a in node.args))
        raise ExprError(f"unsupported syntax in expression {text!r}")

    try:
        value = ev(tree)
    except RecursionError:
        raise ExprError(f"expression nests too deeply: {str(text)[:40]!r}...") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ExprError(f"{text!r} = {value} is not a finite number")
    return value


_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


def holds(text: str, symbols: dict[str, int | float]) -> bool:
    """A condition (tune.constraints): comparisons of expressions (`a < b`, chains
    `1 <= a <= 4`, `==`, `!=`), joined by `and` / `or` / `not`; each operand is an
    expression as `evaluate` takes it. Nothing else is a condition (a bare `nt` is refused:
    write `nt != 0`)."""
    tree = _parse(text)

    def cond(node) -> bool:
        if isinstance(node, ast.BoolOp):
            values = [cond(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not cond(node.operand)
        if isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
            left = evaluate(ast.unparse(node.left), symbols)
            for op, right_node in zip(node.ops, node.comparators):
                right = evaluate(ast.unparse(right_node), symbols)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        raise ExprError(f"{text!r} is not a condition: use comparisons (< <= == != >= >) "
                        "joined by and / or / not")

    try:
        return cond(tree.body)
    except RecursionError:
        raise ExprError(f"condition nests too deeply: {str(text)[:40]!r}...") from None


def _call_name(node: ast.Call, text) -> str:
    """The function a call names, if it is one of min/max with two or more plain arguments."""
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in _FUNCS:
        raise ExprError(f"unsupported function in expression {text!r} (only min and max)")
    if node.keywords or len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
        raise ExprError(f"{name}() in {text!r} takes two or more plain arguments")
    return name


def symbols(text: str | int | float) -> set[str]:
    """The symbols an expression names (the functions it calls left out)."""
    if isinstance(text, (int, float)):
        return set()
    tree = _parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in called}


def to_cpp(text: str | int | float, rename) -> str:
    """Render an expression as C++ integer arithmetic, mapping each symbol through rename."""
    if isinstance(text, (int, float)):
        return repr(text)
    ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Div: "/", ast.Mod: "%"}

    def emit(node):
        if isinstance(node, ast.Expression):
            return emit(node.body)
        if isinstance(node, ast.Constant):
            return repr(node.value)
        if isinstance(node, ast.Name):
            return rename(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return f"({emit(node.left)} {ops[type(node.op)]} {emit(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{emit(node.operand)})"
        if isinstance(node, ast.Call):
            cmp = "<" if _call_name(node, text) == "min" else ">"
            out = emit(node.args[0])
            for arg in node.args[1:]:    # constexpr-friendly, no <algorithm> needed
                a, b = out, emit(arg)
                out = f"({a} {cmp} {b} ? {a} : {b})"
            return out
        raise ExprError(f"expression {text!r} has no C++ form")

    return emit(_parse(text))


# ---- a variant's symbols and the sizes derived from them (the runners use these too)
def constants(codegen: dict) -> dict:
    """What every variant's expressions may name besides its own symbols: threads and the
    numeric params."""
    return {"threads": codegen["threads"],
            **{k: v for k, v in codegen["params"].items() if not isinstance(v, bool)}}


def variant_symbols(codegen: dict, variant: str) -> dict:
    """All symbol values visible to expressions for one variant."""
    return {**constants(codegen), **codegen["variants"][variant]}


def tensor_shape(tensor: dict, symbols: dict) -> list[int]:
    return [int(evaluate(e, symbols)) for e in tensor["shape"]]


def grid_size(codegen: dict, symbols: dict) -> int:
    return int(evaluate(codegen["grid"][0], symbols))


def variant_facts(codegen: dict, perf: dict | None = None) -> dict:
    """Every variant's resolved facts for a gate job (runners/facts.Variant): its tensors'
    shapes, its grid, and with the perf section the bytes one launch moves."""
    out = {}
    for name in codegen["variants"]:
        symbols = variant_symbols(codegen, name)
        tensors = {kind: [{"name": t["name"], "shape": list(tensor_shape(t, symbols)), "dtype": t["dtype"]}
                          for t in codegen[kind]] for kind in ("inputs", "outputs")}
        out[name] = {**tensors, "grid": grid_size(codegen, symbols),
                     "bytes": _bytes(perf["bytes"], symbols) if perf is not None else None}
    return out


def _bytes(spec_bytes, symbols: dict) -> dict:
    if isinstance(spec_bytes, dict):
        read = float(evaluate(spec_bytes["read"], symbols))
        write = float(evaluate(spec_bytes["write"], symbols))
        return {"total": read + write, "read": read, "write": write}
    return {"total": float(evaluate(spec_bytes, symbols)), "read": None, "write": None}
