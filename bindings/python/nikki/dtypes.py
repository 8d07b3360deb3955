"""NKI element types and their numpy / torch counterparts."""

from __future__ import annotations

import numpy as np

from . import _core

try:  # ml_dtypes provides numpy dtypes for bfloat16 and float8 (installed with nikki).
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - ml_dtypes is a dependency; keep plain numpy usable.
    _ml = None  # type: ignore[assignment]

__all__ = ["dtype", "to_dtype", "numpy_dtype", "from_numpy", "from_torch", "torch_dtype"]


class _Named:
    """Shows and hashes a dtype by its NKI name."""

    __slots__ = ()
    name: str  # set by the subclasses

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __hash__(self) -> int:
        return hash(self.name)


class dtype(_Named):
    """An NKI dtype (``nl.float32``, ``nl.bfloat16``, ...).

    Compares equal to its other spellings: ``nl.float32 == np.float32 == "float32"``.
    """

    __slots__ = ("name", "core", "itemsize", "is_float")
    _by_name: dict[str, "dtype"] = {}

    def __init__(self, core: _core.DType):
        self.core = core
        self.name = core.name
        self.itemsize = _core.dtype_size(core)
        self.is_float = _core.dtype_is_float(core)

    __hash__ = _Named.__hash__  # a class that defines __eq__ must restate __hash__

    def __eq__(self, other) -> bool:
        if isinstance(other, dtype):
            return other is self
        try:
            return to_dtype(other) is self
        except (TypeError, ValueError):
            return False

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds this dtype's elements bit for bit."""
        return numpy_dtype(self)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype: numpy reads this attribute, so ``np.zeros(shape, dtype=nl.float32)`` and
        ``a.astype(nl.bfloat16)`` work as with Beta 1, whose dtypes were numpy's."""
        return numpy_dtype(self)


class PackedDType(_Named):
    """A NeuronCore-v4 dtype nikki names but does not model (the x4 packed MX element types and
    the e8m0 scale type): usable in comparisons and signatures, an error as a tensor's dtype."""

    __slots__ = ("name", "itemsize", "is_float")

    def __init__(self, name: str, itemsize: int):
        self.name = name
        self.itemsize = itemsize
        self.is_float = True

    __hash__ = _Named.__hash__

    def __eq__(self, other) -> bool:
        return other is self or (isinstance(other, str) and other == self.name)

    @property
    def core(self):
        raise NotImplementedError(f"nl.{self.name} tensors (an MX format of NeuronCore-v4) are not supported by "
                                  "nikki yet (see docs/api-coverage.md)")

    @property
    def dtype(self) -> np.dtype:
        if self.name == "float8_e8m0fnu" and _ml is not None:
            return np.dtype(_ml.float8_e8m0fnu)
        return np.dtype(f"V{self.itemsize}")


# Four elements packed in each 32-bit (fp8) or 16-bit (fp4) word, and the MX block-scale type.
PACKED_DTYPES = {name: PackedDType(name, size) for name, size in (
    ("float8_e4m3fn_x4", 4), ("float8_e5m2_x4", 4), ("float4_e2m1fn_x4", 2), ("float8_e8m0fnu", 1))}


for _core_dtype in _core.DType.__members__.values():
    dtype._by_name[_core_dtype.name] = dtype(_core_dtype)
# By the enum's integer value (``View.dtype_index``): the tracing hot path.
BY_CORE_INDEX = {int(d.core): d for d in dtype._by_name.values()}

_ALIASES = {
    "f32": "float32", "fp32": "float32", "bf16": "bfloat16", "f16": "float16", "fp16": "float16",
    "half": "float16", "tf32": "tfloat32", "fp8_e4m3": "float8_e4m3", "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "bool": "bool_", "i8": "int8", "i16": "int16", "i32": "int32",
    "u8": "uint8", "u16": "uint16", "u32": "uint32",
}

_NUMPY_NAMES = {
    "float32": "float32", "float16": "float16", "int8": "int8", "int16": "int16", "int32": "int32",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "bool": "bool",
    "bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
}

_UNSUPPORTED_HINT = {
    "float64": "NKI has no float64; convert the array with .astype(np.float32)",
    "int64": "NKI has no int64; convert the array with .astype(np.int32)",
    "uint64": "NKI has no uint64; convert the array with .astype(np.uint32)",
    "complex64": "NKI has no complex dtypes",
    "complex128": "NKI has no complex dtypes",
}


def to_dtype(value) -> dtype | PackedDType:
    """Normalizes any dtype spelling (nikki, NKI string, numpy, ml_dtypes, torch) to a dtype."""
    if isinstance(value, (dtype, PackedDType)):
        return value
    if value is None:  # np.dtype(None) is float64, which would make the error about float64
        raise TypeError("None is not a dtype; pass one such as nl.float32 or np.float32")
    if isinstance(value, _core.DType):
        return BY_CORE_INDEX[int(value)]
    if isinstance(value, str):
        name = _ALIASES.get(value, value)
        if name in dtype._by_name:
            return dtype._by_name[name]
        if name in PACKED_DTYPES:
            return PACKED_DTYPES[name]
        raise TypeError(f"unknown dtype {value!r}; NKI dtypes are {', '.join(sorted(dtype._by_name))}")
    if type(value).__module__ == "torch" or type(value).__name__ == "dtype" and "torch" in repr(value):
        return from_torch(value)
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        raise TypeError(f"{value!r} is not a dtype") from None
    return from_numpy(np_dtype)


def from_numpy(np_dtype: np.dtype) -> dtype:
    """The nikki dtype of a numpy dtype (ml_dtypes' bfloat16 / float8 included)."""
    name = np.dtype(np_dtype).name
    for nikki_name, numpy_name in _NUMPY_NAMES.items():
        if name == numpy_name:
            return dtype._by_name["bool_" if nikki_name == "bool" else nikki_name]
    hint = _UNSUPPORTED_HINT.get(name, "use one of NKI's dtypes")
    raise TypeError(f"numpy dtype {name} is not supported: {hint}")


def numpy_dtype(dt) -> np.dtype:
    """The numpy dtype holding elements of an NKI dtype (tfloat32 is held in float32)."""
    dt = to_dtype(dt)
    name = dt.name
    if name == "tfloat32":
        return np.dtype(np.float32)
    if name == "bool_":
        return np.dtype(np.bool_)
    if name in ("bfloat16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2"):
        if _ml is None:
            raise TypeError(f"{name} arrays need the ml_dtypes package (pip install ml_dtypes)")
        return np.dtype(getattr(_ml, name))
    return np.dtype(name)


_TORCH_NAMES = {
    "float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "int8": "int8",
    "int16": "int16", "int32": "int32", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "bool": "bool_", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}


def from_torch(torch_dtype_value) -> dtype:
    """The nikki dtype of a torch dtype."""
    name = str(torch_dtype_value).replace("torch.", "")
    if name in _TORCH_NAMES:
        return dtype._by_name[_TORCH_NAMES[name]]
    hint = _UNSUPPORTED_HINT.get(name, "use one of NKI's dtypes").replace("np.", "torch.").replace(".astype(", ".to(")
    raise TypeError(f"torch dtype {name} is not supported: {hint}")


def torch_dtype(dt):
    """The torch dtype holding elements of an NKI dtype."""
    import torch

    name = to_dtype(dt).name
    if name == "tfloat32":
        return torch.float32
    if name == "bool_":
        return torch.bool
    if name == "float8_e4m3":
        raise TypeError("torch has no float8_e4m3 (Neuron's legacy fp8); use numpy with ml_dtypes, "
                        "or float8_e4m3fn")
    return getattr(torch, name)
