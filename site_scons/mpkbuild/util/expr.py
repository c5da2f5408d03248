"""Integer expressions in specs (`threads * vec_elems`, `(2 * rows * hidden + hidden) * 2`).

Only names, integer/float literals, + - * // / % **, parentheses and the two functions
min(a, b, ...) and max(a, b, ...) are allowed: a spec is data, never code, so nothing here
calls eval on user text.
"""
from __future__ import annotations

import ast
import operator

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


_FUNCS = {"min": min, "max": max}


class ExprError(ValueError):
    """An expression that does not parse, or names a symbol that is not bound."""


def evaluate(text: str | int | float, symbols: dict[str, int | float]):
    """Evaluate an expression (or pass a number through) with the given symbol values."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return text
    try:
        tree = ast.parse(str(text), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc.msg}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in symbols:
                raise ExprError(f"unknown symbol {node.id!r} in {text!r} "
                                f"(known: {', '.join(sorted(symbols)) or 'none'})")
            return symbols[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call):
            return _FUNCS[_call_name(node, text)](*(ev(a) for a in node.args))
        raise ExprError(f"unsupported syntax in expression {text!r}")

    return ev(tree)


def _call_name(node: ast.Call, text) -> str:
    """The function a call names, if it is one of min/max with two or more plain arguments."""
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in _FUNCS:
        raise ExprError(f"unsupported function in expression {text!r} (only min and max)")
    if node.keywords or len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
        raise ExprError(f"{name}() in {text!r} takes two or more plain arguments")
    return name


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

    return emit(ast.parse(str(text), mode="eval"))


# ---- a variant's symbols and the sizes derived from them (the runners use these too)
def variant_symbols(codegen: dict, variant: str) -> dict:
    """All symbol values visible to expressions for one variant."""
    consts = {"threads": codegen["threads"],
              **{k: v for k, v in codegen["params"].items() if not isinstance(v, bool)}}
    return {**consts, **codegen["variants"][variant]}


def tensor_shape(tensor: dict, symbols: dict) -> list[int]:
    return [int(evaluate(e, symbols)) for e in tensor["shape"]]


def grid_size(codegen: dict, symbols: dict) -> int:
    return int(evaluate(codegen["grid"][0], symbols))
