"""Symbolic input dims as exporters write them (`batch`, `past_sequence_length + 1`, `2*s0`):
parsed once, evaluated from the symbols' values, and solved for the one unknown symbol a given
size fixes."""

from __future__ import annotations

import ast
import re

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b}


class DimExpr:
    """A symbolic dim: one symbol (`batch`), or arithmetic on symbols and integers as exporters
    write it (`past_sequence_length + 1`, `2*s0`). A name with a dash (`seq-len`) is one symbol."""

    def __init__(self, text: str):
        self.text = text
        self._tree: ast.expr | None = None
        if not re.search(r"\w-\w", text):
            try:
                tree = ast.parse(text.strip(), mode="eval").body
            except SyntaxError:
                tree = None
            if tree is not None and self._valid(tree):
                self._tree = tree
        self.symbols = self._names(self._tree) if self._tree is not None else {text}

    def _valid(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and not isinstance(node.value, bool)
        if isinstance(node, ast.BinOp):
            return type(node.op) in _OPS and self._valid(node.left) and self._valid(node.right)
        return False

    def _names(self, node: ast.expr) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    @property
    def is_symbol(self) -> bool:
        return self._tree is None or isinstance(self._tree, ast.Name)

    def evaluate(self, values: dict[str, int]) -> int:
        if self._tree is None:
            return values[self.text]
        return self._eval(self._tree, values)

    def _eval(self, node: ast.expr, values: dict[str, int]) -> int:
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.Constant):
            return node.value  # type: ignore[return-value]
        assert isinstance(node, ast.BinOp)
        return _OPS[type(node.op)](self._eval(node.left, values), self._eval(node.right, values))

    def solve(self, target: int, values: dict[str, int]) -> tuple[str, int] | None:
        """The one unknown symbol's value that makes the dim `target`, if it is linear in it."""
        unknown = [s for s in self.symbols if s not in values]
        if len(unknown) != 1:
            return None
        (name,) = unknown
        at0, at1 = self.evaluate({**values, name: 0}), self.evaluate({**values, name: 1})
        slope = at1 - at0
        if slope == 0 or (target - at0) % slope:
            return None
        return name, (target - at0) // slope
