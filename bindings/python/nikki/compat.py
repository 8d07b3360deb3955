"""Runs unmodified NKI code on nikki: makes ``nki``, ``neuronxcc.nki`` and their ``language``,
``isa`` and ``typing`` modules resolve to nikki's."""

from __future__ import annotations

import sys
import types

__all__ = ["install", "ALIASES"]

# module name NKI code imports -> nikki module that serves it
ALIASES = {
    "nki": "nikki",
    "nki.language": "nikki.language",
    "nki.isa": "nikki.isa",
    "nki.typing": "nikki.typing",
    "neuronxcc.nki": "nikki",
    "neuronxcc.nki.language": "nikki.language",
    "neuronxcc.nki.isa": "nikki.isa",
    "neuronxcc.nki.typing": "nikki.typing",
}


def install() -> None:
    """Registers the aliases in sys.modules (idempotent). Existing real modules of those names
    are replaced for this process, so nikki serves every NKI import."""
    import importlib

    if "neuronxcc" not in sys.modules or not getattr(sys.modules["neuronxcc"], "_nikki_alias", False):
        package = types.ModuleType("neuronxcc", "nikki stand-in for the Neuron compiler package")
        package.__path__ = []  # a package, so `import neuronxcc.nki` resolves through sys.modules
        package._nikki_alias = True
        sys.modules["neuronxcc"] = package
    for alias, target in ALIASES.items():
        module = importlib.import_module(target)
        sys.modules[alias] = module
        parent, _, child = alias.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
