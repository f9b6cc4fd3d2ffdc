"""The report's contract has one meaning in four places; this test fails when they drift (issue 21 item 3).

    python report_contract_test.py GRADTRACE_DIFF GRADTRACE_SYNTH DIFF_DIR WORK_DIR

The four places: the JSON writers (diff/report/*: report, `--step all` table, partial report), the JSON
schemas (DIFF_DIR/report.schema.json, steps.schema.json, partial.schema.json) and the field tables of
DIFF_DIR/REPORT_SCHEMA.md. Real outputs of gradtrace-diff on synthetic trace sets (a diff with --html,
--self, --step all both ways, a reported grad norm, --noise, partial reports) must:
  1. validate against their schema;
  2. hold, in every object the schema closes (additionalProperties: false), exactly the schema's
     properties in the schema's order (the writers write every key, always, in the documented order);
     every closed object of the schemas appears at least once (nothing documented goes unwritten);
  3. be documented: every property is named in its REPORT_SCHEMA.md section, and the first column of
     that section's field table lists exactly the properties, in the same order;
  4. agree on the version: the title of REPORT_SCHEMA.md, the reports' and the parts' schema_version.
Exit 0 when all hold; otherwise every disagreement, one per line, and exit 1.
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import jsonschema
import referencing

DIFF, SYNTH, DIFF_DIR, WORK = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])
SCHEMAS = {name: json.loads((DIFF_DIR / f"{name}.schema.json").read_text()) for name in ("report", "steps", "partial")}
DOC = (DIFF_DIR / "REPORT_SCHEMA.md").read_text()
problems = []


def run(*argv, expect):
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
    if p.returncode not in expect:
        sys.exit(f"{argv}: exit {p.returncode}\n{p.stdout}{p.stderr}")


def outputs():
    """{schema name: [(file, instance)]} from real runs."""
    w = WORK
    shutil.rmtree(w, ignore_errors=True)
    w.mkdir(parents=True)
    synth = {"ref": [], "ref2": ["--split-seed", "11"], "sp2": ["--sp", "2", "--zero-stage", "2", "--scaling",
                                                                  "ds-4530", "--loss", "local-mean"],
             "sp4": ["--dp", "2", "--sp", "4", "--zero-stage", "2", "--scaling", "ds-4530", "--loss", "local-mean",
                     "--steps", "2"],
             "norm": ["--reported-grad-norm", "1.5", "--steps", "2"], "bad": ["--dp", "2", "--scramble", "head.weight"],
             "amb": ["--dp", "2", "--gas", "2", "--loss-multiplier", "2"],
             "loc": ["--dp", "2", "--scramble", "layers.0.mlp.fc2.weight"]}
    for name, args in synth.items():
        run(SYNTH, w / name, *args, expect={0})
    run(DIFF, w / "ref", w / "sp2", "--json", w / "diff.json", "--html", w / "diff.html", expect={1})
    run(DIFF, "--self", w / "sp4", "--json", w / "self.json", expect={0, 1})
    run(DIFF, w / "ref", w / "norm", "--json", w / "norm.json", expect={0, 1})
    run(DIFF, w / "ref", w / "amb", "--json", w / "amb.json", expect={1})  # dp = gas: candidates and a rerun
    run(DIFF, w / "ref", w / "loc", "--json", w / "loc.json", expect={1})  # a mismatch inside: its localisation
    run(DIFF, w / "ref", w / "bad", "--noise", w / "ref2", "--json", w / "noise.json", expect={1})
    run(DIFF, w / "norm", w / "norm", "--step", "all", "--json", w / "steps.json", expect={0})
    run(DIFF, "--self", w / "sp4", "--step", "all", "--json", w / "self-steps.json", expect={0, 1})
    for k in (0, 1):
        run(DIFF, w / "ref", w / "bad", "--noise", w / "ref2", "--shard", f"{k}/2", "--json", w / f"part-{k}.json",
            expect={0})
    run(DIFF, "--merge", w / "part-0.json", w / "part-1.json", "--json", w / "merged.json", expect={1})
    load = lambda f: (f, json.loads((w / f).read_text()))
    return {"report": [load(f) for f in ("diff.json", "self.json", "norm.json", "noise.json", "merged.json",
                                         "amb.json", "loc.json")],
            "steps": [load("steps.json"), load("self-steps.json")],
            "partial": [load("part-0.json"), load("part-1.json")]}


REGISTRY = referencing.Registry().with_resources(
    (f"{name}.schema.json", referencing.Resource.from_contents(s)) for name, s in SCHEMAS.items())


def node_at(schema_name, pointer):
    """The node of SCHEMAS[schema_name] at a JSON pointer fragment ("#/$defs/param", "#/oneOf/1")."""
    node = SCHEMAS[schema_name]
    for part in pointer.lstrip("#").strip("/").split("/"):
        if part:
            node = node[int(part) if isinstance(node, list) else part]
    return node


def resolve(schema_name, node):
    """Follows $ref (local, or to another of the three files): (schema name, node, pointer)."""
    pointer = "#"
    while "$ref" in node:
        target, _, frag = node["$ref"].partition("#")
        if target:
            schema_name = target.removesuffix(".schema.json")
        node, pointer = node_at(schema_name, frag), "#" + frag
    return schema_name, node, pointer


def walk(schema_name, node, pointer, instance, where, seen):
    """Checks instance against node's closed objects; records each closed object met in `seen`."""
    if "$ref" in node:
        schema_name, node, pointer = resolve(schema_name, node)
    if "oneOf" in node:
        for i, branch in enumerate(node["oneOf"]):
            name, b, ptr = resolve(schema_name, branch) if "$ref" in branch else (schema_name, branch,
                                                                                  f"{pointer}/oneOf/{i}")
            if isinstance(instance, dict) == (b.get("type") == "object"):
                return walk(name, b, ptr, instance, where, seen)
        return
    if isinstance(instance, list) and "items" in node:
        for i, item in enumerate(instance):
            walk(schema_name, node["items"], f"{pointer}/items", item, f"{where}[{i}]", seen)
        return
    if not isinstance(instance, dict) or "properties" not in node:
        return
    props = list(node["properties"])
    key = f"{schema_name}.schema.json{pointer}"
    if node.get("additionalProperties") is False:
        seen.add(key)
        if list(instance) != props:
            problems.append(f"{where}: keys {list(instance)} are not {key}'s properties in order {props}")
    else:  # protobuf's JSON mapping (Config): every documented field is written
        missing = [p for p in props if p not in instance]
        if missing:
            problems.append(f"{where}: {key} documents {missing}, not written")
    for p, sub in node["properties"].items():
        if p in instance:
            walk(schema_name, sub, f"{pointer}/properties/{p}", instance[p], f"{where}.{p}", seen)


def closed_objects(schema_name, node, pointer, out):
    """Every closed object schema reachable in one file (refs into other files are theirs)."""
    if not isinstance(node, dict):
        return
    if node.get("additionalProperties") is False and "properties" in node:
        out.add(f"{schema_name}.schema.json{pointer}")
    for k, v in node.items():
        if k in ("properties", "$defs"):
            for name, sub in v.items():
                closed_objects(schema_name, sub, f"{pointer}/{k}/{name}", out)
        elif k == "items":
            closed_objects(schema_name, v, f"{pointer}/items", out)
        elif k == "oneOf":
            for i, sub in enumerate(v):
                closed_objects(schema_name, sub, f"{pointer}/oneOf/{i}", out)


def section(heading_start):
    """The text of the REPORT_SCHEMA.md section whose '## ' heading starts with heading_start."""
    parts = re.split(r"^## ", DOC, flags=re.M)
    found = [p for p in parts if p.startswith(heading_start)]
    if len(found) != 1:
        sys.exit(f"REPORT_SCHEMA.md: {len(found)} sections start with {heading_start!r}")
    return found[0]


def first_column(table_text):
    """Field names in the first column of the field table rows, in order ('`a`, `b[]`' -> a, b)."""
    names = []
    for line in table_text.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and line.startswith("|") and not set(cells[1].strip()) <= set("-"):
            names += [n.removesuffix("[]") for n in re.findall(r"`([^`]+)`", cells[1])]
    return names


def tables(text):
    """The section's tables, each as its text."""
    return re.findall(r"(?:^\|.*\n)+", text, flags=re.M)


def row(text, field):
    rows = [line for line in text.splitlines() if line.startswith(f"| `{field}`")]
    if len(rows) != 1:
        sys.exit(f"REPORT_SCHEMA.md: {len(rows)} rows start with `{field}`")
    return rows[0]


def properties(key):
    name, _, pointer = key.partition(".schema.json")
    return list(node_at(name, pointer)["properties"])


# Where each closed object is documented: (section heading, which table or row). A table's first column
# must list the properties in order; a row or a section's prose must name each property.
TOP, PARTIAL = "Top level", "Partial reports"
DOCUMENTED = {
    "report.schema.json#": (TOP, ("table", 0)),
    "report.schema.json#/properties/tolerance": (TOP, ("row", "tolerance")),
    "report.schema.json#/properties/findings/items": ("`findings[]`", ("prose",)),
    "report.schema.json#/properties/steps/items": (TOP, ("row", "steps[]")),
    "report.schema.json#/properties/grad_norm/oneOf/1": ("Reported grad norm", ("prose",)),
    "report.schema.json#/$defs/trace": (TOP, ("row", "trace_a")),
    "report.schema.json#/$defs/trace/properties/reductions/items": (TOP, ("row", "trace_a")),
    "report.schema.json#/$defs/param": ("`params[]`", ("table", 0)),
    "report.schema.json#/$defs/group": ("`groups[]`", ("prose",)),
    "report.schema.json#/$defs/candidate_cause": ("`groups[]`", ("row", "candidates")),
    "report.schema.json#/$defs/localisation": ("`groups[]`", ("row", "localisation")),
    "report.schema.json#/$defs/self_param": ("`self_params[]`", ("prose",)),
    "report.schema.json#/$defs/bucket_cell": ("Per-rank x per-bucket view", ("table", 0)),
    "steps.schema.json#": ("Every step", ("table", 0)),
    "partial.schema.json#": (PARTIAL, ("table", 0)),
    "partial.schema.json#/properties/shard": (PARTIAL, ("row", "shard")),
    "partial.schema.json#/$defs/param": (PARTIAL, ("table", 1)),
    "partial.schema.json#/$defs/replica": (PARTIAL, ("row", "replicas")),
}


def check_documented(key, heading, where):
    props = properties(key)
    text = section(heading)
    if where[0] == "table":
        listed = first_column(tables(text)[where[1]])
        if listed != props:
            problems.append(f"REPORT_SCHEMA.md '{heading}' table {where[1]} lists {listed}; {key} has {props}")
        return
    if where[0] == "row":
        text = row(text, where[1])
    named = set(re.findall(r"`([^`]+)`", text))
    missing = [p for p in props if p not in named]
    if missing:
        problems.append(f"REPORT_SCHEMA.md '{heading}' does not name {missing} of {key}")


def main():
    for name, schema in SCHEMAS.items():
        jsonschema.Draft202012Validator.check_schema(schema)
    seen = set()
    runs = outputs()
    for name, items in runs.items():
        validator = jsonschema.Draft202012Validator(SCHEMAS[name], registry=REGISTRY)
        for file, instance in items:
            for e in validator.iter_errors(instance):
                problems.append(f"{file}: {'/'.join(map(str, e.absolute_path))}: {e.message[:200]}")
            walk(name, SCHEMAS[name], "#", instance, file, seen)

    closed = set()
    for name, schema in SCHEMAS.items():
        closed_objects(name, schema, "#", closed)
    for key in sorted(closed - seen):
        problems.append(f"{key}: no output of the writers holds it (the corpus must cover every object)")
    for key in sorted(closed - DOCUMENTED.keys()):
        problems.append(f"{key}: no REPORT_SCHEMA.md section is known to document it (add it to DOCUMENTED)")
    for key, (heading, where) in DOCUMENTED.items():
        check_documented(key, heading, where)

    title = re.match(r"# gradtrace-diff report \(schema_version (\d+\.\d+)\)", DOC)
    versions = {f: inst["schema_version"] for items in runs.values() for f, inst in items}
    # 'Partial reports' states its version twice: `schema_version` "X.Y" in the prose, `"X.Y"` in the table.
    partial_doc = set(re.findall(r"`schema_version` \"(\d+\.\d+)\"|\| `schema_version`, `tool` \| `\"(\d+\.\d+)\"`",
                                 section(PARTIAL)))
    partial_doc = {v for pair in partial_doc for v in pair if v}
    if not title or len(partial_doc) != 1:
        problems.append(f"REPORT_SCHEMA.md: no version in its title, or not one in 'Partial reports' ({partial_doc})")
    else:
        for f, v in versions.items():
            want = next(iter(partial_doc)) if f.startswith("part-") else title[1]
            if v != want:
                problems.append(f"{f}: schema_version {v}, REPORT_SCHEMA.md says {want}")
    print(f"{sum(len(i) for i in runs.values())} outputs, {len(seen)} closed objects covered of {len(closed)}, "
          f"{len(DOCUMENTED)} documented sections checked")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
