"""The names of the loss recipes (``loss=`` of every adapter, ``Config.loss`` in a trace).

The one list is the C++ one (``semantics/loss_recipes.cc``: ``KnownLossRecipes`` and the aliases,
``LossRecipeAliases``), read through the extension module: gradtrace-diff explains a factor by these
names, so a name it does not know would only be carried along. The aliases are the DeepSpeed loops'
command-line spellings (the #5248 issue's ``loss`` and ``loss / sp``, the ALST tutorial's), each
naming a recipe of that list.
"""

from __future__ import annotations

from .. import _gtcodec

__all__ = ["ALIASES", "known", "check", "resolve"]

# Alias -> recipe name, from semantics/loss_recipes.cc.
ALIASES = dict(_gtcodec.loss_recipe_aliases())


def known() -> list[str]:
    """Every loss recipe name, as semantics/loss_recipes.cc lists them."""
    return list(_gtcodec.loss_recipes())


def resolve(name: str) -> str:
    """The recipe ``name`` names: itself for a recipe, its recipe for an alias; ValueError otherwise."""
    return check(name, aliases=True)


def check(name, *, who: str = "gradtrace", keyword: str = "loss", aliases: bool = False) -> str:
    """``name`` when it is a known recipe or "" (unspecified); with ``aliases`` an alias of
    ``ALIASES`` gives its recipe. Anything else: ValueError listing the known names."""
    if isinstance(name, str):
        if name == "":
            return ""
        if aliases and name in ALIASES:
            return ALIASES[name]
        names = known()
        if name in names:
            return name
    else:
        names = known()
    also = f", or the aliases {', '.join(ALIASES)}" if aliases else ""
    raise ValueError(f"{who}: {keyword}={name!r} is not a known loss recipe; known: {', '.join(names)}{also} "
                     f"(\"\" leaves it unspecified)")
