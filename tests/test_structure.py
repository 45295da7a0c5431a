"""Structure rules of the code base (issue 13): no import cycles between modules (function-level
imports included) and no backend-name checks in the core outside the backends."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: built-in backend names; the core must not decide anything by comparing against them
BACKEND_NAMES = {"torch", "openvino", "onnxruntime", "onnx"}
#: core packages that are one runtime's own code (its exporter, its quantizer)
RUNTIME_SPECIFIC = ("cosyvino/export/", "cosyvino/quantize/")


def _modules() -> dict[str, Path]:
    mods = {}
    for base in ("cosyvino", "plugins"):
        for path in (ROOT / base).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/fixtures/" in rel:
                continue
            if rel.startswith("plugins/"):
                rel = rel[len("plugins/"):]
            name = rel[:-3].replace("/", ".")
            if name.endswith(".__init__"):
                name = name[: -len(".__init__")]
            mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict) -> set[str]:
    """Modules of ours that ``name`` imports anywhere (module level or inside functions),
    without its own ancestor packages (importing a submodule runs them first anyway)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_including_function_level_imports():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _name_checks(path: Path) -> list[str]:
    """``x == "openvino"``-style comparisons and ``in (... "openvino" ...)`` tests."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        if any(isinstance(c, ast.Attribute) and c.attr == "modules" for c in node.comparators):
            continue  # `"torch" in sys.modules` asks what is imported, not which backend
        operands = [node.left, *node.comparators]
        consts = []
        for o in operands:
            if isinstance(o, ast.Constant) and isinstance(o.value, str):
                consts.append(o.value)
            elif isinstance(o, (ast.Tuple, ast.List, ast.Set)):
                consts += [e.value for e in o.elts
                           if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if BACKEND_NAMES & set(consts):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return hits


def test_no_backend_name_checks_in_the_core():
    hits = []
    for path in sorted((ROOT / "cosyvino").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(RUNTIME_SPECIFIC) or "/fixtures/" in rel:
            continue
        hits += _name_checks(path)
    assert hits == []


def test_name_check_finder_finds_one(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f(b):\n    return b == 'openvino' or b in ('x', 'onnxruntime')\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert _name_checks(p) == ["m.py:2", "m.py:2"]
    finally:
        ROOT = old


#: (importer prefix, imported prefix) pairs that would run up the layers (issue 34): the
#: backends' shared code knows no family, the planner no benchmark code
UPWARD = (("cosyvino.backends", "cosyvino.families.cosyvoice"), ("cosyvino.planner", "cosyvino.bench"))


def _face_imports(path: Path) -> list[int]:
    """Lines where a module imports the package face ``cosyvino`` itself (``import cosyvino``,
    ``from cosyvino import X`` with X not a submodule) instead of the leaf that defines X."""
    mods = _modules()
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "cosyvino" for a in node.names):
            lines.append(node.lineno)
        elif (isinstance(node, ast.ImportFrom) and node.module == "cosyvino" and not node.level
              and any(f"cosyvino.{a.name}" not in mods for a in node.names)):
            lines.append(node.lineno)
    return lines


def test_no_upward_imports():
    mods = _modules()
    hits = [f"{m} -> {t}" for m, p in mods.items() for t in _imports(m, p, mods)
            for low, high in UPWARD if m.startswith(low) and t.startswith(high)]
    assert hits == []


def test_the_package_face_is_imported_by_no_module_of_ours():
    hits = [f"{m}:{line}" for m, p in _modules().items() if m != "cosyvino"
            for line in _face_imports(p)]
    assert hits == []


def test_face_import_finder_finds_one(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import cosyvino\nfrom cosyvino import __version__\nfrom cosyvino import errors\n")
    assert _face_imports(p) == [1, 2]
