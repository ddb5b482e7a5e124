"""Whether DeepSpeed's ZeRO-3 code carries the sp fix, read from the code (not from a version). Pure."""

from __future__ import annotations

import ast
from typing import Iterable


def _identifiers(node: ast.AST) -> Iterable[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
        elif isinstance(sub, ast.keyword) and sub.arg:
            yield sub.arg


def source_has_fix(source: str) -> bool:
    """Whether ``__avg_scatter_grads`` (a method of any class in ``source``), or a ``self.*`` method it calls, names
    an identifier containing ``sequence_parallel`` (code, not comments or strings)."""
    tree = ast.parse(source)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        target = methods.get("__avg_scatter_grads")
        if target is None:
            continue
        calls = {
            sub.func.attr
            for sub in ast.walk(target) if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
            and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "self"
        }
        searched = [target] + [methods[name] for name in sorted(calls) if name in methods]
        if any("sequence_parallel" in ident for func in searched for ident in _identifiers(func)):
            return True
    return False
