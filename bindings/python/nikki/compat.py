"""Runs unmodified NKI code on nikki: makes ``nki``, ``neuronxcc.nki`` and their submodules
(``language``, ``isa``, ``isa.constants``, ``typing``, ``compiler``, ``collectives``) resolve to
nikki's."""

from __future__ import annotations

import sys
import types

from . import _core

__all__ = ["install", "ALIASES", "present_simulated_instance", "INSTANCE_TYPE_FILE"]

# module name NKI code imports -> nikki module that serves it
ALIASES = {
    "nki": "nikki",
    "nki.language": "nikki.language",
    "nki.isa": "nikki.isa",
    "nki.isa.constants": "nikki.isa.constants",
    "nki.typing": "nikki.typing",
    "nki.compiler": "nikki.compiler",
    "nki.compiler.kernel_builder": "nikki.compiler.kernel_builder",
    "nki.collectives": "nikki.collectives",
    "neuronxcc.nki": "nikki",
    "neuronxcc.nki.language": "nikki.language",
    "neuronxcc.nki.isa": "nikki.isa",
    "neuronxcc.nki.isa.constants": "nikki.isa.constants",
    "neuronxcc.nki.typing": "nikki.typing",
    "neuronxcc.nki.compiler": "nikki.compiler",
}


def _module(name: str) -> types.ModuleType:
    """The nikki module `name`, including the module objects that live as attributes of their
    parent (``nikki.isa.constants``, ``nikki.compiler.kernel_builder``)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        parent, _, child = name.rpartition(".")
        return getattr(_module(parent), child)


def install() -> None:
    """Registers the aliases in sys.modules (idempotent). Existing real modules of those names
    are replaced for this process, so nikki serves every NKI import."""
    if "neuronxcc" not in sys.modules or not getattr(sys.modules["neuronxcc"], "_nikki_alias", False):
        package = types.ModuleType("neuronxcc", "nikki stand-in for the Neuron compiler package")
        package.__path__ = []  # a package, so `import neuronxcc.nki` resolves through sys.modules
        package._nikki_alias = True  # type: ignore[attr-defined]
        sys.modules["neuronxcc"] = package
    for alias, target in ALIASES.items():
        module = _module(target)
        sys.modules[alias] = module
        parent, _, child = alias.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


# Where Linux tells the EC2 instance type (e.g. "trn2.48xlarge"); NKI test suites read it to decide
# which tests the machine's NeuronCore generation can run.
INSTANCE_TYPE_FILE = "/sys/devices/virtual/dmi/id/product_name"


def present_simulated_instance() -> None:
    """Makes reads of the instance-type file report the simulated target, "<target>.nikki" (e.g.
    "trn2.nikki", the target being NEURON_PLATFORM_TARGET_OVERRIDE's or nikki's default), so code that
    picks its tests by instance type tests the NeuronCore nikki simulates. Idempotent."""
    import builtins
    import io

    if getattr(builtins.open, "_nikki_instance", False):
        return
    real_open = builtins.open

    def open_reporting_instance(file, mode="r", *args, **kwargs):
        if isinstance(file, str) and file == INSTANCE_TYPE_FILE and "r" in mode and "+" not in mode:
            text = f"{_simulated_target()}.nikki\n"
            return io.BytesIO(text.encode()) if "b" in mode else io.StringIO(text)
        return real_open(file, mode, *args, **kwargs)

    open_reporting_instance._nikki_instance = True  # type: ignore[attr-defined]
    builtins.open = open_reporting_instance


def _simulated_target() -> str:
    import os

    name = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or _core.default_target()
    try:
        return _core.target_info(str(name))["name"]
    except Exception:  # an unknown target fails where a kernel is compiled, with its own error
        return str(name)
