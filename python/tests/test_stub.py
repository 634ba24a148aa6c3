"""The hand-written stub (``fetchahead/__init__.pyi``) against the code: every public name of the
package has a stub, every stub names something real, and each function's and method's
parameters (names, kinds, defaults) are the real ones'. Annotations are not compared (the stub
spells them for type checkers). The torch entry points live in ``fetchahead._torch``, which
needs torch: without it their signatures are read from its source instead of imported.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Optional

import pytest

import fetchahead

PACKAGE = Path(fetchahead.__file__).parent
STUB = PACKAGE / "__init__.pyi"

# (name, kind, default): kind as inspect.Parameter spells it, default `inspect.Parameter.empty`
# for none (compared by value: the stub's defaults are literals).
Params = list[tuple[str, str, Any]]
NO_DEFAULT = inspect.Parameter.empty


def _default(node: Optional[ast.expr]) -> Any:
    if node is None:
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def params_of_ast(fn: ast.FunctionDef) -> Params:
    """The parameters a `def` in source declares."""
    a = fn.args
    out: Params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, _default(default)))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", NO_DEFAULT))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", _default(default)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", NO_DEFAULT))
    return out


def params_of(obj: Any) -> Params:
    """The parameters of a live function or method (`self` included, as the stub has it)."""
    return [
        (p.name, p.kind.name, p.default) for p in inspect.signature(obj).parameters.values()
    ]


def stub_tree(text: str) -> ast.Module:
    return ast.parse(text)


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def _torch_source_defs() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((PACKAGE / "_torch.py").read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _runtime_function_params(name: str) -> Params:
    """The parameters of the package's function `name`, imported, or read from `_torch.py`'s
    source for a torch entry point when torch is missing."""
    if name in fetchahead._TORCH_FUNCTIONS and importlib.util.find_spec("torch") is None:
        return params_of_ast(_torch_source_defs()[name])
    return params_of(getattr(fetchahead, name))


def mismatches(text: str) -> list[str]:
    """Every way the stub `text` disagrees with the package, as readable lines."""
    found: list[str] = []
    tree = stub_tree(text)
    stubbed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            stubbed.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.AnnAssign, ast.Assign)):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            stubbed.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef):
            stubbed.add(node.name)
            if node.name not in fetchahead._TORCH_FUNCTIONS and not hasattr(fetchahead, node.name):
                found.append(f"{node.name}: stubbed but not in the package")
                continue
            want = _runtime_function_params(node.name)
            if params_of_ast(node) != want:
                found.append(f"{node.name}: stub {params_of_ast(node)} != code {want}")
        elif isinstance(node, ast.ClassDef):
            stubbed.add(node.name)
            cls = getattr(fetchahead, node.name, None)
            if cls is None:
                found.append(f"{node.name}: stubbed but not in the package")
                continue
            found.extend(_class_mismatches(node, cls))
    for name in fetchahead.__all__:
        if name not in stubbed:
            found.append(f"{name}: in __all__ but not in the stub")
    return found


def _class_mismatches(node: ast.ClassDef, cls: type) -> list[str]:
    found: list[str] = []
    members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
    for name, fn in members.items():
        real = inspect.getattr_static(cls, name, None)
        if real is None:
            found.append(f"{node.name}.{name}: stubbed but not in the class")
        elif _is_property(fn) != isinstance(real, property):
            found.append(f"{node.name}.{name}: a property in one and not the other")
        elif not _is_property(fn) and params_of_ast(fn) != params_of(getattr(cls, name)):
            found.append(
                f"{node.name}.{name}: stub {params_of_ast(fn)} != code {params_of(getattr(cls, name))}"
            )
    public = {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    for name in sorted(public - set(members)):
        found.append(f"{node.name}.{name}: in the class but not in the stub")
    return found


def test_the_stub_matches_the_code():
    problems = mismatches(STUB.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "edit, expected",
    [
        # A parameter renamed, a default changed, a method dropped, a name invented.
        (("capacity: int = 4096", "rows: int = 4096"), "Prefetcher.__init__"),
        (("dim: int = 256,\n    shards", "dim: int = 128,\n    shards"), "make_table"),
        (("    def evict_page_cache(self) -> None: ...\n", ""), "RowStore.evict_page_cache"),
        (("def flush_logs() -> None: ...", "def flush_all() -> None: ..."), "flush_all"),
    ],
)
def test_the_check_finds_a_stub_that_drifted(edit, expected):
    old, new = edit
    text = STUB.read_text()
    assert old in text, old
    problems = mismatches(text.replace(old, new, 1))
    assert any(p.startswith(expected) for p in problems), problems
