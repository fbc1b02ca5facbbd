"""The import graph of src/fedfactor: no circle between modules, and packages in one layer order.

Every import counts, at the top of a file or inside a function: a lazy import that hides a circle
is still a circle. The graph is read with `ast`, without importing anything.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "fedfactor"

# Bottom to top: a package may import only from packages in lower layers (and from itself). Packages
# in one layer do not import each other. `fedfactor` is the package's __init__ (its __version__).
LAYERS = [
    {"fedfactor", "errors"},
    {"registry", "io", "devices", "environment"},
    {"config"},
    {"data", "reparam", "analysis"},  # analysis/: mathematics on weights, no knowledge of models or runs
    {"models"},
    {"fl"},  # the primitives: state, communication meter, local training, batched clients
    {"methods"},
    # tracking: a run's MLflow mirror; report: finished run folders read back, their tables and
    # figures (files only, no training)
    {"tracking", "report"},
    {"run"},  # one run: its clients, the round loop, its records and summary, the job that keeps its folder
    # diagnostics: a run's kept client weights analysed and drawn; fedfac_simulation: FedFac's
    # simulation study (no training runs)
    {"diagnostics", "fedfac_simulation"},
    {"study"},  # a study: its expansion into runs, tuning, checks, plan, progress, figures, verdicts
    {"cli"},
    {"__main__"},
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The layer entry of a module: fedfactor.report.paper -> report, fedfactor.cli -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def read_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The fedfactor modules `module` imports anywhere in its file. `from A import n` counts as an
    import of the module A.n when n is a module, else of A (whose __init__ runs)."""
    # the package relative imports start from: the module's own for an __init__, else its parent's
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                found.add(f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source)
    return {m for m in found if m in modules and m != module}


@functools.cache  # one parse for all the tests; none of them changes the graph
def import_graph() -> dict[str, set[str]]:
    modules = read_modules()
    return {m: imports_of(m, p, set(modules)) for m, p in modules.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others."""
    reach = {m: reachable(graph, m) for m in graph}
    circular = [m for m in sorted(graph) if m in reach[m]]
    groups = []
    for m in circular:
        group = sorted(n for n in circular if n in reach[m] and m in reach[n])
        if group not in groups:
            groups.append(group)
    return groups


def test_the_parser_sees_relative_absolute_and_in_function_imports():
    graph = import_graph()
    # relative, at the top of the file
    assert "fedfactor.methods" in graph["fedfactor.run.simulator"]
    # `from .diagnostics import heatmaps` names a module
    assert "fedfactor.diagnostics.heatmaps" in graph["fedfactor.study.figures"]
    # inside a function (cli imports each command's module when the command runs)
    assert "fedfactor.fedfac_simulation.study" in graph["fedfactor.cli"]
    # `from ..models import HeadedModel` is an import of the package, whose __init__ runs
    assert "fedfactor.models" in graph["fedfactor.methods.fedrod"]


def test_the_cycle_finder_reports_each_circle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"]]


def test_no_module_imports_itself_through_others():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in read_modules()}
    assert packages <= set(LAYER), f"place these in LAYERS: {sorted(packages - set(LAYER))}"


@pytest.mark.parametrize("layer", range(len(LAYERS)), ids=["+".join(sorted(layer)) for layer in LAYERS])
def test_packages_import_only_from_lower_layers(layer):
    back = [f"{m} -> {t}" for m, targets in sorted(import_graph().items()) if LAYER.get(package_of(m)) == layer
            for t in sorted(targets) if package_of(t) != package_of(m) and LAYER.get(package_of(t), -1) >= layer]
    assert not back, "imports at or above their own layer:\n" + "\n".join(back)


# The package's top level: the command line, the config, the errors and the infrastructure every
# layer uses. A run's modules live in run/, a study's in study/.
TOP_LEVEL = {"fedfactor.__main__", "fedfactor.cli", "fedfactor.config", "fedfactor.errors",
             "fedfactor.io", "fedfactor.registry", "fedfactor.devices", "fedfactor.environment"}


def test_the_top_level_holds_the_cli_config_errors_and_infrastructure_only():
    top = {m for m in read_modules() if m.count(".") == 1 and not (SRC / m.replace(".", "/")).is_dir()}
    assert top == TOP_LEVEL
