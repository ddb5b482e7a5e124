"""Whether DeepSpeed's ZeRO-3 code carries the sp fix, read from the code (not from a version). Pure.

The harness's, because every layer asks it: the downstream reproducer of the installed build, the
pipeline of a source tree, the doctor of the user's install.
"""

from __future__ import annotations

import ast
from typing import Iterable, Sequence


def _identifiers(node: ast.AST) -> Iterable[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
        elif isinstance(sub, ast.keyword) and sub.arg:
            yield sub.arg


def _self_method_calls(func: ast.FunctionDef) -> set[str]:
    calls = set()
    for sub in ast.walk(func):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "self"):
            calls.add(sub.func.attr)
    return calls


def source_has_fix(source: str, function: str = "__avg_scatter_grads",
                   markers: Sequence[str] = ("sequence_parallel", )) -> bool:
    """Whether ``function`` (a method of any class in ``source``) accounts for sequence parallelism.

    Code, not text: comments and strings do not count. The method itself and the ``self.*``
    methods it calls (one level: an upstream fix may live in a helper such as
    ``_gradient_averaging_world_size``) are searched for an identifier containing a marker,
    e.g. ``self.sequence_parallel_size`` or ``groups._get_sequence_parallel_world_size()``.
    """
    tree = ast.parse(source)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        target = methods.get(function)
        if target is None:
            continue
        searched = [target] + [methods[name] for name in sorted(_self_method_calls(target)) if name in methods]
        if any(marker in ident for func in searched for ident in _identifiers(func) for marker in markers):
            return True
    return False
