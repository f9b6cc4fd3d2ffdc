"""The package's layout (python/README.md): gradtrace.codec, gradtrace.adapters and gradtrace.deepspeed_versions
behind the documented public names, no import cycles in python/gradtrace or tools/repro, and no module that
stands in for another through sys.modules."""

import ast
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
assert gradtrace.read_trace_set.__module__ == "gradtrace.codec.trace"
for name in {_lazy_adapter_modules()!r}:
    assert getattr(gradtrace, name).__name__ == "gradtrace.adapters." + name, name
from gradtrace import manual_adapter, RankRecorder, Layout
assert manual_adapter.attach and RankRecorder.__module__ == "gradtrace.adapters.rank_recorder"
assert Layout.__module__ == "gradtrace.adapters.layout"
from gradtrace.deepspeed_versions import command
assert callable(command.main)
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(BUILD / "python")))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
