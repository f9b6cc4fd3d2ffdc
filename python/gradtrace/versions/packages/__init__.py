"""Per-package descriptions for gradtrace-versions: what differs from one distribution to another is data here,
so that the command's code knows no package by name.

A description is `<normalised name>.json` in this folder (DeepSpeed's: deepspeed.json); a package without one
gets DEFAULTS. Every field is optional:

    display_name      the package's name in the report's title ("DeepSpeed")
    alias             a command that is `gradtrace-versions --package NAME` ("gradtrace-deepspeed-versions")
    defaults          sp, reference ("first" | "single-rank"), deps ("resolve" | "none") when not given
    deps_allowed      the --deps values the package's environments support
    config            {"required": bool, "title": the report's heading, "variable": the script contract's extra
                      name for the config file}
    release_variable  the script contract's extra name for the release under test
    run_env           variables of every run (a value may name {world}, the number of ranks)
    after_import      {module: "pkg.module:function"}: called with the module as a user's script imports it
    single_rank_reference  how the single-rank reference's config follows from the run's: "multiply_by_dp" (keys
                      whose value is multiplied by dp: one rank takes the global batch), "drop" (keys removed)
    cache             {"root", "root_variable", "key_names_package"}: the results cache's default folder, the
                      variable that overrides it, and whether the package's name is part of a run's key (false
                      keeps the keys gradtrace-deepspeed-versions wrote before this command existed)
    environments      how a release's environment is built (gradtrace.versions.envs): "root", "root_variable",
                      "venv" (the folder name, "{name}-{release}"), "pip_in_venv", "install_first",
                      "install_options", "install_env", "import_check", "check_env", and "bases": a pinned
                      base (name, pins, import stubs) for the releases "before" a given one
    loops             built-in entry points (--model NAME): "script", a path in a gradtrace source checkout (the
                      loops are studies: tools/repro, not the wheel), its "args" ({sp} {dp} {config} {loss}
                      {out} {timeout} filled in), "sources" (checkout paths) and "package_sources" (modules)
                      whose bytes key the cache, and "help"
    emulation         "pkg.module:function" returning the command line of --emulation
"""

import copy
import functools
import importlib
import json
import os
import pathlib

from gradtrace.versions.releases import normalize_name

HERE = pathlib.Path(__file__).resolve().parent

DEFAULTS = {
    "display_name": None,
    "alias": None,
    "defaults": {"sp": 1, "reference": "first", "deps": "resolve"},
    "deps_allowed": ["resolve", "none"],
    "config": {"required": False, "title": "Config", "variable": None},
    "release_variable": None,
    "run_env": {},
    "after_import": {},
    "single_rank_reference": {"multiply_by_dp": [], "drop": []},
    "cache": {"root": "~/.cache/gradtrace/versions", "root_variable": "GRADTRACE_VERSIONS_CACHE",
              "key_names_package": True},
    "environments": {"root": "~/.cache/gradtrace/version-envs", "root_variable": "GRADTRACE_VERSION_ENVS",
                     "venv": "{name}-{release}", "pip_in_venv": False, "install_first": [], "install_options": [],
                     "install_env": {}, "import_check": None, "check_env": {}, "bases": []},
    "loops": {},
    "emulation": None,
}


def _merged(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


class Description:
    """One package's description: DEFAULTS with its file laid over them (nested objects merged key by key)."""

    def __init__(self, name: str, data: dict):
        self.name = normalize_name(name)
        self.data = _merged(DEFAULTS, data)
        self.display_name = self.data["display_name"] or name

    def __getitem__(self, key):
        return self.data[key]

    def root(self, section: str) -> pathlib.Path:
        """The default folder of "cache" or "environments": its variable when set, else its root."""
        s = self.data[section]
        return pathlib.Path(os.environ.get(s["root_variable"] or "", "") or s["root"]).expanduser()

    def hook(self, ref: str):
        """The function a "module:function" field names."""
        module, _, function = ref.partition(":")
        return getattr(importlib.import_module(module), function)


@functools.lru_cache(maxsize=None)
def _files() -> dict:
    """{normalised name: parsed file} of every description in this folder."""
    return {normalize_name(p.stem): json.loads(p.read_text()) for p in sorted(HERE.glob("*.json"))}


def describe(package: str) -> Description:
    """The description of `package` (DEFAULTS when it has none)."""
    return Description(package, _files().get(normalize_name(package), {}))


def described() -> list:
    """Every package that has a description."""
    return [describe(name) for name in _files()]


def loop_names() -> list:
    """Every built-in loop of every description (the choices of --model)."""
    return sorted({loop for d in described() for loop in d["loops"]})


def owner_of(field: str, value=None):
    """The display name of the first description with `field` set (and holding `value` when given), or None."""
    for d in described():
        if d[field] and (value is None or value in d[field]):
            return d.display_name
    return None


def by_alias(command: str):
    """The package whose alias is `command` (a program name), or None."""
    for d in described():
        if d["alias"] == command:
            return d.name
    return None
