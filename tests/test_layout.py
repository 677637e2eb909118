"""The package layout is the architecture: every module imports only from its own layer and the
layers below it (docs/architecture.md), and the public API of `import geolens` stays whole."""

import ast
import re
from pathlib import Path

import pytest

import geolens

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "geolens"

#: the layers, bottom first: a module may import from its own layer and any layer before it
LAYERS = ["errors", "threads", "model", "runs", "training", "sweeps", "analysis", "outputs", "cli"]
#: modules outside the layers: the public API's lazy re-exports and `python -m geolens`
FACADE = {"geolens", "geolens.__main__"}


def layer_of(module: str) -> str:
    """The layer of a dotted geolens module name ('geolens.runs.storage' -> 'runs')."""
    top = module.split(".")[1]
    if top not in LAYERS:
        raise ValueError(f"{module} is in no layer; add its package to LAYERS and docs/architecture.md")
    return top


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def geolens_imports(source: str, module: str, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported geolens module) for every import in `source`, at any depth unless
    top_level_only (a function's lazy import counts: it runs sooner or later). `from geolens.x
    import name` names geolens.x.name when that is a module, else geolens.x."""
    out = []
    tree = ast.parse(source)
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "geolens"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{module}:{node.lineno} uses a relative import; write the absolute geolens path")
            if node.module and node.module.split(".")[0] == "geolens":
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or \
                        (PACKAGE.parent / sub.replace(".", "/")).is_dir()
                    out.append((node.lineno, sub if is_module else node.module))
    return out


def upward_imports(source: str, module: str) -> list[str]:
    """One line per import of `module`'s source that reaches a layer above its own."""
    own = LAYERS.index(layer_of(module))
    bad = []
    for line, target in geolens_imports(source, module):
        if target in FACADE:
            bad.append(f"{module}:{line} imports the package facade `{target}`; import the module that defines the name")
        elif LAYERS.index(layer_of(target)) > own:
            bad.append(f"{module}:{line} ({layer_of(module)}) imports {target} ({layer_of(target)}), a layer above")
    return bad


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p) not in FACADE}


def test_every_module_is_in_a_layer():
    assert {layer_of(m) for m in package_modules()} == set(LAYERS)
    top = {p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", "."))} - {"reference"}
    modules = ("errors", "threads", "cli")
    assert top == {f"{name}.py" for name in modules} | set(LAYERS) - set(modules)


def test_no_module_imports_a_layer_above_its_own():
    bad = [line for m, p in package_modules().items() for line in upward_imports(p.read_text(), m)]
    assert bad == []


@pytest.mark.parametrize("module, source, expected", [
    ("geolens.model.fast", "from geolens.outputs.plots import FigureSpec", 1),
    ("geolens.runs.integrity", "def repair():\n    from geolens.training.recording import finish_run", 1),
    ("geolens.training.train", "import geolens.sweeps.grid as grid", 1),
    ("geolens.runs.run", "from geolens import load_run", 1),
    ("geolens.outputs.tables", "from geolens.runs import runset\nfrom geolens.model.config import GeoConfig", 0),
    ("geolens.model.tasks", "from geolens.errors import GeoError\nfrom geolens.model import config", 0),
])
def test_the_check_finds_an_upward_import(module, source, expected):
    assert len(upward_imports(source, module)) == expected


def test_module_level_imports_have_no_cycle():
    graph = {m: {t for _, t in geolens_imports(p.read_text(), m, top_level_only=True) if t in package_modules()}
             for m, p in package_modules().items()}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in graph[m]:
            assert state.get(t) != 1, f"import cycle: {' -> '.join(path + [m, t])}"
            if t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_architecture_doc_lists_the_layers_in_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\d+\. \*\*[^*]+\*\* \(`geolens[./]([a-z_]+)", section, re.M)
    assert named == LAYERS


def test_public_api_is_whole():
    names = {"GeoConfig", "make_config", "GeoError", "GeoTransformer", "GeoActivationCache", "residual_parts",
             "Dataset", "make_dataset", "Run", "AnalysisRun", "load_run", "compute_metrics", "reference_run"}
    assert names <= set(dir(geolens)) and set(geolens.__all__) == names
    for name in names:
        assert getattr(geolens, name).__name__ == name
