# The compiled extension (bindings/src/module.cpp). Its pybind11 classes and functions are not
# described here: every attribute is Any to the type checker.
from typing import Any

def __getattr__(name: str) -> Any: ...
