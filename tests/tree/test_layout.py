"""The tree's shape: small modules, and packages that depend one way."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "actorlearner"
MAX_LINES = 450


def modules() -> list[Path]:
    """Every hand-written module (the generated protobuf code in v1/ aside)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts)


def unit(path: Path) -> str:
    """The part of the tree a module belongs to: its top-level package, or itself if it is a top-level module."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_names(path: Path) -> set[tuple[str, ...]]:
    """Every name a module imports from actorlearner, split at the dots (``from a.b import c`` names ``a.b``
    and ``a.b.c``), at any depth of its code (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(tuple(name.split(".")[1:]) for name in names if name.split(".")[0] == "actorlearner")
    return found


def imported_units(path: Path) -> set[str]:
    """The parts of actorlearner a module imports."""
    return {parts[0] for parts in imported_names(path)
            if parts and ((PACKAGE / parts[0]).exists() or (PACKAGE / f"{parts[0]}.py").exists())}


def module_name(path: Path) -> str:
    """A module's dotted name under actorlearner (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The actorlearner modules a module imports (``from a.b import c`` names ``a.b.c`` when that is a module)."""
    return {".".join(parts) for parts in imported_names(path)
            if parts and (PACKAGE.joinpath(*parts).with_suffix(".py").exists()
                          or (PACKAGE.joinpath(*parts) / "__init__.py").exists())}


def module_graph(package: str) -> dict[str, set[str]]:
    """Imports among the modules of one package (its ``__init__``, which re-exports them, left out)."""
    graph: dict[str, set[str]] = {}
    for path in modules():
        name = module_name(path)
        if name.startswith(f"{package}.") and path.name != "__init__.py":
            graph[name] = {m for m in imported_modules(path) if m.startswith(f"{package}.") and m != name}
    return graph


def dependency_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in modules():
        source = unit(path)
        graph.setdefault(source, set()).update(u for u in imported_units(path) if u not in (source, "v1"))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_is_longer_than_the_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_no_part_of_the_tree_imports_a_part_that_imports_it_back():
    assert cycles(dependency_graph()) == []


def test_no_module_imports_a_module_of_its_package_that_imports_it_back():
    packages = sorted({unit(p) for p in modules() if p.parent != PACKAGE})
    found = {package: groups for package in packages if (groups := cycles(module_graph(package)))}
    assert found == {}
    assert module_graph("learner")["learner.learner"] >= {"learner.training", "learner.replay_service"}  # it looks


def constructor_arguments(package: str) -> dict[str, list[tuple[str, str]]]:
    """Each class of ``package`` by name: its ``__init__``'s arguments besides self and config, (name, annotation)."""
    found = {}
    for path in modules():
        if unit(path) != package:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        args = item.args.posonlyargs + item.args.args + item.args.kwonlyargs
                        found[node.name] = [(a.arg, ast.unparse(a.annotation) if a.annotation else "")
                                            for a in args if a.arg not in ("self", "config")]
    return found


def test_the_learners_parts_take_few_arguments_and_no_lock():
    arguments = constructor_arguments("learner")
    assert {"Learner", "TrainingLoop", "Ingest", "ReplayService", "Evaluation"} <= set(arguments)
    assert {name: len(args) for name, args in arguments.items() if len(args) > 6} == {}
    locks = {name: arg for name, args in arguments.items() for arg in args
             if any(kind in arg[0] + arg[1] for kind in ("lock", "Lock", "Condition", "Semaphore"))}
    assert locks == {}


def uses(attribute: str, called: bool = False) -> set[str]:
    """The modules (``learner.round``) that read ``attribute`` of anything (or, ``called``, call it)."""
    found = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            target = node.func if called and isinstance(node, ast.Call) else node
            if isinstance(target, ast.Attribute) and target.attr == attribute and (called or isinstance(node, ast.Attribute)):
                found.add(module_name(path))
    return found


def calls(name: str) -> set[str]:
    """The modules that call ``name`` (a class or function, by its bare name)."""
    return {module_name(path) for path in modules() for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name}


def test_one_part_holds_the_buffer_and_its_lock_and_one_runs_the_round():
    """Only the replay service touches its buffer (``replay.buffer``) and lock; the training round alone takes
    leave to sample, asks the ranks to agree and builds the step; nothing hands a lock to a caller."""
    readers = {name for name in uses("buffer")
               if name.startswith("learner.") and name != "learner.replay_service"}
    assert readers == set(), f"modules reaching into the replay service's buffer: {readers}"
    assert uses("locked", called=True) == set()
    assert uses("credit", called=True) == {"learner.round"}
    assert uses("agree", called=True) == {"learner.round"}
    assert calls("LearnerStep") == {"learner.round"} and calls("TrainingRound") == {"learner.training"}


def test_one_part_keeps_the_seq_table_and_forgets_departed_actors():
    """The exactly-once part alone holds the seq table (saved and restored as one piece): the replay service
    claims and releases seqs as it stores, ingest asks it about resends, and it alone drops departed actors."""
    assert uses("claim_seq", called=True) == uses("release_seq", called=True) == {"learner.replay_service"}
    assert uses("duplicate", called=True) == {"learner.ingest"}
    assert uses("drop_departed", called=True) == {"learner.exactly_once"}
    def the_table(target: ast.expr) -> bool:
        target = target.value if isinstance(target, ast.Subscript) else target
        return isinstance(target, ast.Attribute) and target.attr in ("seq_table", "_seqs")
    writers = {module_name(path) for path in modules() for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                   map(the_table, node.targets if isinstance(node, ast.Assign) else [node.target]))}
    assert writers == {"learner.exactly_once"}, writers


def test_publishing_alone_hands_out_the_broadcasts():
    """The server and the evaluator ask publishing for a stream's broadcast, a subscription and the latest
    state dict: no part but the Learner (which composes them) and publishing reaches the ONNX feed or the
    learner's broadcast."""
    feed_readers = {name for name in uses("onnx_feed") if name.startswith("learner.")}
    assert feed_readers == {"learner.learner", "learner.publishing"}, feed_readers
    through_learner = {module_name(path) for path in modules() for node in ast.walk(ast.parse(path.read_text(), str(path)))
                       if isinstance(node, ast.Attribute) and node.attr == "broadcast"
                       and ast.unparse(node.value).split(".")[-1] == "learner"}
    assert through_learner == set(), through_learner


def test_a_part_that_declares_figures_reports_them_no_other_way():
    """Status, Prometheus, the progress line and TensorBoard's gauges all come from one ``figures()`` per part."""
    reporting = {"report", "metrics", "progress", "gauges", "scalars"}
    both, declaring = {}, set()
    for path in modules():
        if unit(path) != "learner":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                methods = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
                if "figures" in methods:
                    declaring.add(node.name)
                    if methods & reporting:
                        both[node.name] = sorted(methods & reporting)
    assert both == {}
    assert {"Progress", "ReplayService", "Ingest", "TrainingLoop", "Evaluation"} <= declaring


def test_the_cycle_check_finds_a_two_way_and_a_three_way_import():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x"}}
    assert sorted(cycles(graph)) == [["a", "b"], ["x", "y", "z"]]
