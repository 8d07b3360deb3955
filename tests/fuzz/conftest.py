"""tests/fuzz is a package (so that its test modules do not clash with tests/python's), while
kernelfuzz is imported as a top-level package, as `python -m kernelfuzz` and the fuzz workers
import it: this folder goes on sys.path."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
