"""The package's layout (python/README.md): gradtrace.codec, gradtrace.adapters and gradtrace.versions behind the
documented public names, no import cycles in python/gradtrace or tools/repro, no module that stands in for another
through sys.modules; gradtrace.versions knows no package by name (per-package facts are its descriptions' data,
and every hook, loop and source a description names exists), and no study ships in the package (issue 43: the
#5248 loop, models and mpu live in tools/repro/ds5248)."""

import ast
import json
import os
import subprocess
import sys

from conftest import BUILD, ROOT

PACKAGE = ROOT / "python" / "gradtrace"
REPRO = ROOT / "tools" / "repro"


def _lazy_adapter_modules():
    """gradtrace/__init__.py's _ADAPTER_MODULES: the public names of the modules in gradtrace.adapters."""
    for node in ast.walk(ast.parse((PACKAGE / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_ADAPTER_MODULES":
            return [e.value for e in node.value.elts]
    raise AssertionError("gradtrace/__init__.py has no _ADAPTER_MODULES")


def _modules():
    """{module: path}: the package's modules by dotted name, and the repro scripts as "dir:name" (the scripts of
    one directory import each other by bare name); the extension _gtcodec as a leaf."""
    mods = {"gradtrace._gtcodec": None}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    for p in REPRO.glob("*/*.py"):
        mods[f"{p.parent.name}:{p.stem}"] = p
    return mods


def import_graph():
    """{module: set of the project's modules it imports}, from every import statement (module level and inside
    functions); `from pkg import name` counts as pkg.name when that is a module (or a lazy public name of one)."""
    mods = _modules()
    lazy = {f"gradtrace.{n}": f"gradtrace.adapters.{n}" for n in _lazy_adapter_modules()}

    def resolve(name, importer):
        if ":" in importer and f"{importer.split(':')[0]}:{name.split('.')[0]}" in mods:
            return f"{importer.split(':')[0]}:{name.split('.')[0]}"
        name = lazy.get(name, name)
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in mods}
    for m, path in mods.items():
        if path is None:
            continue
        package = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if resolve(f"{base}.{a.name}", m) not in (None, resolve(base, m))
                         else base for a in node.names]
            else:
                continue
            graph[m].update(r for r in (resolve(n, m) for n in names) if r and r != m)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
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
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert cycles(graph) == []
    # the graph sees what it should: the repro's checks read gradtrace-diff's report through compare
    assert "ds5248:compare" in graph["ds5248:checks"] and "ds5248:binaries" in graph["ds5248:compare"]
    assert {"ds5248:model", "ds5248:mpu", "gradtrace.versions.launch"} <= graph["ds5248:loop"]
    assert "gradtrace.adapters.rank_recorder" in graph["gradtrace.adapters.deepspeed_adapter"]


def test_nothing_stands_in_for_another_module():
    """No module replaces itself (or another) in sys.modules: each lives under one name."""
    for path in list(PACKAGE.rglob("*.py")) + list(REPRO.glob("*/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                assert not (isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules"), \
                    f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"


def test_public_names_load_their_subpackage_modules_without_torch_first():
    """`import gradtrace` imports no torch; the documented names reach gradtrace.adapters' modules."""
    code = f"""
import sys
import gradtrace
assert "torch" not in sys.modules, "import gradtrace imported torch"
from gradtrace.versions import command, runner, script_main
from gradtrace.versions.packages import deepspeed_hooks
assert "torch" not in sys.modules, "gradtrace.versions imported torch"
assert gradtrace.read_trace_set.__module__ == "gradtrace.codec.trace"
for name in {_lazy_adapter_modules()!r}:
    assert getattr(gradtrace, name).__name__ == "gradtrace.adapters." + name, name
from gradtrace import manual_adapter, RankRecorder, Layout
assert manual_adapter.attach and RankRecorder.__module__ == "gradtrace.adapters.rank_recorder"
assert Layout.__module__ == "gradtrace.adapters.layout"
from gradtrace.versions import command
assert callable(command.main) and callable(command.alias_main)
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(BUILD / "python")))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def _compares_with(tree, word):
    """The comparisons in `tree` with the string `word` (any case) on a side, or in a tuple/list/set there."""
    def holds(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.lower() == word
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(holds(e) for e in node.elts)

    return [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and any(holds(x) for x in [n.left, *n.comparators])]


def test_versions_knows_no_package_by_name():
    """What differs between packages is a description's data (gradtrace/versions/packages/*.json): no module of
    gradtrace.versions compares a package's name with "deepspeed" (issue 43: seven did)."""
    found = []
    for path in sorted((PACKAGE / "versions").rglob("*.py")):
        for node in _compares_with(ast.parse(path.read_text()), "deepspeed"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
    assert _compares_with(ast.parse('if package.lower() in ("x", "DeepSpeed"): pass'), "deepspeed")  # it sees one


def test_no_study_ships_in_the_package():
    """The #5248 loop, models and mpu are a study (tools/repro/ds5248), not the library: no ds5248* file under
    python/gradtrace, and no module there imports one from tools/repro."""
    assert sorted(p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("ds5248*")) == []
    graph = import_graph()
    assert [(m, sorted(d for d in deps if ":" in d)) for m, deps in graph.items()
            if m.startswith("gradtrace") and any(":" in d for d in deps)] == []


def test_every_description_names_what_exists():
    """Each package description parses; every hook it names is a function of the package; every built-in loop's
    script and sources are files of this checkout (tools/repro), its package sources modules of the package."""
    from gradtrace.versions import packages

    descriptions = sorted((PACKAGE / "versions" / "packages").glob("*.json"))
    assert [p.name for p in descriptions] == ["deepspeed.json"]
    for path in descriptions:
        data = json.loads(path.read_text())
        assert set(data) - {"about", "run_env_why"} <= set(packages.DEFAULTS), path.name
        desc = packages.describe(path.stem)
        for ref in [*desc["after_import"].values(), *([desc["emulation"]] if desc["emulation"] else [])]:
            assert callable(desc.hook(ref)), ref
        for name, loop in desc["loops"].items():
            for f in [loop["script"], *loop.get("sources", ())]:
                assert (ROOT / f).is_file() and f.startswith("tools/repro/"), (name, f)
            for m in loop.get("package_sources", ()):
                assert m.startswith("gradtrace.") and m in import_graph(), (name, m)
    assert packages.by_alias("gradtrace-deepspeed-versions") == "deepspeed"
    assert packages.describe("Some_Package").display_name == "Some_Package"  # no description: the defaults
