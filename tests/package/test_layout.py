"""The package layers, read from the import graph (docs/ARCHITECTURE.md, "Layers").

Every import counts, also those inside functions (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:``. Rules:

- ``engine`` imports nothing of dart_core outside ``engine`` but ``config``;
- ``models`` never import ``api``, ``ui``, ``bench``, ``drafters`` or ``training``;
- ``ngram`` imports nothing of ``models`` (callers pass the tokenizer and the table's path) but its command line,
  which loads the tokenizer the user names;
- ``bench`` imports no ``ui`` and no ``api``; ``hardware`` imports no ``models``;
- no module reads another module's private attribute (``x._name``, ``getattr(x, "_name")``, ``from m import _name``);
- a drafter never imports another drafter's module (``drafters/pruning`` is DART's);
- only ``page`` imports gradio (``ui`` computes what the page shows without it), and nothing in dart_core imports
  ``page`` (it sits on top: ``app.py`` serves it);
- only the figures (``ui/viz`` and ``ui/viz_*``, ``ui/teaching_*``, ``bench/report``) import plotly;
- nothing imports ``training`` but its command line (``dart_core/training/cli.py`` and ``training/`` itself);
- no module imports itself through others (no cycles);
- every test file sits in a folder of tests/ named for what it tests, none directly under tests/.
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "dart_core"


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
        return "dart" if leaf in ("pruning", "chain") else leaf     # DART's pruner and its chain search are DART's
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if owner(m) for d in deps
                 if owner(d) and owner(d) != owner(m))
    assert bad == []


def test_only_the_page_imports_gradio():
    assert _violations(GRAPH, lambda m: not _in(m, "page"), lambda d: d == "gradio" or d.startswith("gradio_")) == []
    assert any(d == "gradio" for m, deps in GRAPH.items() if _in(m, "page") for d in deps)   # the rule sees it


def test_nothing_imports_the_page():
    assert _violations(GRAPH, lambda m: not _in(m, "page"), lambda d: _in(d, "page")) == []


def test_ngram_imports_no_model_code_but_its_command_line():
    """The store and the builder take the tokenizer and the table's path from their callers (loading.py); only the
    command line turns a ``--tokenizer`` name into a tokenizer, through the targets' loader."""
    command_line = {"dart_core.ngram.cli", "dart_core.ngram.__main__"}
    assert _violations(GRAPH, lambda m: _in(m, "ngram") and m not in command_line,
                       lambda d: _in(d, "models")) == []


def test_the_benchmark_imports_neither_the_page_nor_the_api():
    assert _violations(GRAPH, lambda m: _in(m, "bench"), lambda d: _in(d, "ui") or _in(d, "api")) == []


def test_hardware_imports_no_model_code():
    assert _violations(GRAPH, lambda m: m == "dart_core.hardware", lambda d: _in(d, "models")) == []


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


# ---------------------------------------------------------------- private attributes

def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


_ATTR_FUNCS = {"getattr", "hasattr", "setattr", "delattr"}


def _attr_by_name(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``getattr(x, "_name", ...)`` and its kin: (x, "_name")."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTR_FUNCS
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value
    return None


def _private_definitions(tree: ast.Module) -> set[str]:
    """The private names a module defines: attributes it assigns (``x._name = ...``, ``setattr(x, "_name", ...)``),
    names in its class bodies (methods, class attributes) and its module-level definitions. An import defines
    nothing: ``from .. import _native`` binds a name another module owns."""
    names: set[str] = set()
    scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in scopes:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        by_name = _attr_by_name(node)
        if by_name and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            names.add(by_name[1])
    return {n for n in names if _private(n)}


def _package_sources() -> dict[str, tuple[str, bool]]:
    """module -> (its source, whether it is a package's ``__init__``), for every module of dart_core."""
    return {_module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py") for p in PKG.rglob("*.py")}


def private_reads(sources: dict[str, tuple[str, bool]] | None = None) -> list[str]:
    """Every place a module of dart_core reads a private attribute that another module of dart_core owns.

    ``x._name`` (or ``getattr(x, "_name")``) with x not ``self`` / ``cls`` is the module's own business only when
    the module defines ``_name`` and no other module does: a name two modules define (``_native`` is an N-gram
    store's and a tree builder's) cannot tell whose object x is, so reading it off another object counts as a
    reach. ``from m import _name`` reads m's private name, unless ``m._name`` is a module of the package m (a
    package's private submodule, e.g. ``dart_core._native``, belongs to every module inside it). Private names no
    module of dart_core defines (a library's, e.g. numpy's ``_core``) are the library's business, not a layer's."""
    sources = _package_sources() if sources is None else sources
    trees = {m: ast.parse(text) for m, (text, _) in sources.items()}
    modules = set(trees) | {"dart_core._native"}   # the compiled extension
    owners: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        for name in _private_definitions(tree):
            owners.setdefault(name, set()).add(mod)
    found = []
    for mod, tree in trees.items():
        is_pkg = sources[mod][1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                source = (".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                          if node.level else node.module or "")
                for alias in node.names:
                    if (_private(alias.name) and source.startswith("dart_core")
                            and not (f"{source}.{alias.name}" in modules and mod.startswith(source + "."))):
                        found.append(f"{mod}:{node.lineno} from {source} import {alias.name}")
                continue
            if isinstance(node, ast.Attribute):
                obj, name = node.value, node.attr
            elif _attr_by_name(node):
                obj, name = _attr_by_name(node)
            else:
                continue
            if not _private(name) or name not in owners:
                continue
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                continue
            if owners[name] != {mod}:
                found.append(f"{mod}:{node.lineno} {ast.unparse(obj)}.{name} (defined in {', '.join(sorted(owners[name]))})")
    return sorted(found)


def test_no_module_reads_another_modules_private_attribute():
    assert private_reads() == []


def test_the_private_reader_sees_reaches():
    """The rule would pass vacuously if the reader missed the forms it checks: each one, in two small modules."""
    a = ("def _helper():\n    pass\n"
         "class A:\n    def __init__(self):\n        self._x = 1\n        self._native = 2\n"
         "    def _own(self, other):\n        return other._x\n")
    b = ("from .a import A, _helper\nfrom . import _native\n"
         "class B:\n    def __init__(self):\n        self._native = None\n        self._y = self._native\n"
         "def f(a: A):\n    return a._x, getattr(a, '_x'), a._native, a.__dict__, a._not_ours\n")
    found = private_reads({"dart_core": ("", True), "dart_core.a": (a, False), "dart_core.b": (b, False)})
    assert found == ["dart_core.b:1 from dart_core.a import _helper",
                     "dart_core.b:8 a._native (defined in dart_core.a, dart_core.b)",
                     "dart_core.b:8 a._x (defined in dart_core.a)",
                     "dart_core.b:8 a._x (defined in dart_core.a)"]


def test_the_page_and_the_benchmark_draw_with_one_palette():
    """The palette moved below both (dart_core/palette.py); the page's copy in ui/viz.py must match it until the
    page imports it."""
    from dart_core.palette import OKABE_ITO
    from dart_core.ui import viz
    assert viz.OKABE_ITO == OKABE_ITO


MAX_LINES = 600


def test_no_product_source_file_is_over_600_lines():
    """One concern a file (issue 41): the native code (kernels per instruction-set family, the pool, path choice,
    bindings per subsystem) and the Python product code stay readable in one sitting."""
    root = PKG.parent
    files = [*(root / "native" / "src").glob("*.[ch]pp"), *PKG.rglob("*.py"), *(root / "benchmarks").glob("*.py"),
             root / "app.py"]
    assert len(files) > 50
    long = {str(f.relative_to(root)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split by concern): {long}"


DRAFTER_CLASSES = {"DartDrafter", "Eagle3Drafter", "PromptLookupDrafter", "SwitchDrafter"}


def test_one_module_builds_drafters_from_a_method_name():
    """dart_core/methods.py is the one builder (issue 41): the page, the API, the benchmark, its scripts,
    regeneration and the vLLM check call it; no other product module constructs a drafter class."""
    root = PKG.parent
    files = [*PKG.rglob("*.py"), *(root / "benchmarks").glob("*.py"), root / "app.py"]
    calls = []
    for f in files:
        rel = str(f.relative_to(root))
        if rel == "dart_core/methods.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(), rel)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in DRAFTER_CLASSES:
                    calls.append(f"{rel}:{node.lineno} {name}(...)")
    assert not calls, f"drafters built outside dart_core.methods: {calls}"


def test_the_page_is_composed_not_mixed_in():
    """The page's parts are objects the Visualiser constructs with what each needs (issue 41): no class in
    dart_core/page/ inherits from more than one base, so no part reads attributes another part set on a shared
    ``self``."""
    files = sorted((PKG / "page").glob("*.py"))
    assert len(files) > 8
    classes, mixed = 0, []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef):
                classes += 1
                if len(node.bases) > 1:
                    mixed.append(f"{f.name}:{node.lineno} {node.name}({', '.join(map(ast.unparse, node.bases))})")
    assert classes >= 6   # the rule would pass vacuously if the scan missed the classes
    assert not mixed, f"classes with several bases in dart_core/page: {mixed}"


def test_every_test_file_is_in_a_group_folder():
    """The tests are grouped like the package (docs/ARCHITECTURE.md section 1): each ``test_*.py`` lives in a folder
    of tests/ named for what it tests (tests/engine/, tests/page/, ...); tests/ itself holds only what the groups
    share (conftest.py, helper modules, data/). The folders are no packages (no ``__init__.py``), so pytest imports
    each test file by its name: no two may share one."""
    tests = PKG.parent / "tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose, f"test files directly under tests/ (move each into the folder of what it tests): {loose}"
    grouped = sorted(tests.glob("*/test_*.py"))
    assert len({p.parent.name for p in grouped}) >= 8 and len(grouped) > 40   # the scan sees the groups
    names = [p.name for p in grouped]
    shared = sorted({n for n in names if names.count(n) > 1})
    assert not shared, f"test files sharing a name (pytest cannot import both): {shared}"
