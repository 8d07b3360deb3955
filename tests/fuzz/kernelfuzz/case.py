"""A generated test case: the source of a kernel module, what must happen when it runs, and the
numpy reference of its outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExpectedError:
    """A kernel the hardware would reject: nikki must raise KernelError whose message matches
    `pattern` (a regular expression, case-insensitive), located at one of `lines` of the kernel's
    file (empty: any line of that file)."""

    pattern: str
    lines: tuple = ()
    what: str = ""  # the broken rule, for reports


@dataclass
class Case:
    """One fuzz case.

    ``source`` is a complete Python module defining ``kernel`` (an ``@nki.jit`` function),
    ``make_inputs()`` (the host arrays) and ``GRID`` (the SPMD launch grid, () for none).
    ``expected`` holds, per output, the reference ``Val`` or None where the output is not
    modelled; ``error`` is set for invalid kernels."""

    seed: int
    front: str  # "python" or "cpp"
    source: str
    error: ExpectedError | None = None
    expected: list = field(default_factory=list)
    output_dtypes: list = field(default_factory=list)
    features: list = field(default_factory=list)  # what the case exercises, for coverage counts

    @property
    def valid(self) -> bool:
        return self.error is None
