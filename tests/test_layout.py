"""The package layers, read from the import graph (docs/ARCHITECTURE.md, "Layers").

Every import counts, also those inside functions (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:``. Rules:

- ``engine`` imports nothing of dart_core outside ``engine`` but ``config``;
- ``models`` never import ``api``, ``ui``, ``bench``, ``drafters`` or ``training``;
- a drafter never imports another drafter's module (``drafters/pruning`` is DART's);
- only ``page`` imports gradio (``ui`` computes what the page shows without it), and nothing in dart_core imports
  ``page`` (it sits on top: ``app.py`` serves it);
- only the figures (``ui/viz`` and ``ui/viz_*``, ``ui/teaching_*``, ``bench/report``) import plotly;
- nothing imports ``training`` but its command line (``dart_core/training/cli.py`` and ``training/`` itself);
- no module imports itself through others (no cycles).
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dart_core"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under_type_checking(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """module -> the modules (dart_core.* resolved to files, or third-party top names) it imports."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _under_type_checking(node, parents):
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    root = ".".join(base + ([node.module] if node.module else []))
                else:
                    root = node.module or ""
                names = [root] + [f"{root}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("dart_core"):
                    # the longest prefix that is a module of the package
                    parts = name.split(".")
                    while parts and ".".join(parts) not in modules:
                        parts.pop()
                    if parts and ".".join(parts) != mod:
                        out.add(".".join(parts))
                elif name:
                    out.add(name.split(".")[0])
        graph[mod] = out
    return graph


def _in(mod: str, pkg: str) -> bool:
    return mod == f"dart_core.{pkg}" or mod.startswith(f"dart_core.{pkg}.")


def _violations(graph, who, bad) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if who(m) for d in deps if bad(d))


GRAPH = import_graph()


def test_the_layers_exist():
    for pkg in ("engine", "drafters", "ngram", "models", "models.heads", "training", "bench", "ui", "page"):
        assert f"dart_core.{pkg}" in GRAPH, pkg


def test_engine_imports_nothing_above_it():
    allowed = {"dart_core", "dart_core.config", "dart_core._native"}
    assert _violations(GRAPH, lambda m: _in(m, "engine"),
                       lambda d: d.startswith("dart_core") and not _in(d, "engine") and d not in allowed) == []


def test_models_import_no_higher_layer():
    assert _violations(GRAPH, lambda m: _in(m, "models"),
                       lambda d: any(_in(d, p) for p in ("api", "ui", "bench", "drafters", "training"))) == []


def test_a_drafter_never_imports_another_drafters_module():
    def owner(m: str) -> str | None:
        if not _in(m, "drafters") or m == "dart_core.drafters":
            return None
        leaf = m.split(".")[2]
        return "dart" if leaf == "pruning" else leaf
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if owner(m) for d in deps
                 if owner(d) and owner(d) != owner(m))
    assert bad == []


def test_only_the_page_imports_gradio():
    assert _violations(GRAPH, lambda m: not _in(m, "page"), lambda d: d == "gradio" or d.startswith("gradio_")) == []
    assert any(d == "gradio" for m, deps in GRAPH.items() if _in(m, "page") for d in deps)   # the rule sees it


def test_nothing_imports_the_page():
    assert _violations(GRAPH, lambda m: not _in(m, "page"), lambda d: _in(d, "page")) == []


def test_only_the_figures_draw():
    """plotly stays in the modules that draw (ui/viz and its figure families ui/viz_*, ui/teaching_*, the
    benchmark report): the session, its record, the narration, the loading and the trace analytics
    (engine/trace_stats) compute without it."""
    drawing = {"dart_core.ui.viz", "dart_core.ui.viz_tree", "dart_core.ui.viz_steps", "dart_core.ui.viz_cost",
               "dart_core.ui.teaching_round", "dart_core.ui.teaching_whatif", "dart_core.bench.report"}
    assert drawing <= set(GRAPH)   # a renamed figure module must be renamed here too
    assert _violations(GRAPH, lambda m: m not in drawing, lambda d: d == "plotly") == []
    for mod in ("dart_core.ui.session", "dart_core.ui.record", "dart_core.ui.narration", "dart_core.loading"):
        assert not any(d in drawing for d in GRAPH[mod]), mod


def test_only_the_training_command_line_imports_training():
    assert _violations(GRAPH, lambda m: not _in(m, "training") and m != "dart_core.train",
                       lambda d: _in(d, "training")) == []


def test_no_import_cycles():
    internal = {m: {d for d in deps if d in GRAPH} for m, deps in GRAPH.items()}
    # a package's __init__ re-exporting its own modules is no cycle of code
    for m in internal:
        internal[m] = {d for d in internal[m] if not (m.startswith(d + ".") and d in GRAPH)}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in internal[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(internal):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_graph_reader_sees_lazy_imports():
    """The rules would pass vacuously if function-level or relative imports were missed."""
    assert "dart_core.engine.tree" in GRAPH["dart_core.engine.decoding"]
    assert any(_in(d, "training") for d in GRAPH["dart_core.train"])
