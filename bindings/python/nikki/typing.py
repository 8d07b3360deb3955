"""nki.typing: shape annotations and the mutable-parameter marker."""

from __future__ import annotations

__all__ = ["tensor", "mutable_tensor"]


class _TensorAnnotation:
    """``nt.tensor[128, 512]``: documents a parameter's shape (checked by nothing, as in NKI)."""

    def __init__(self, shape=None, mutable=False):
        self.shape = shape
        self._nikki_mutable = mutable

    def __getitem__(self, shape):
        return _TensorAnnotation(shape if isinstance(shape, tuple) else (shape,), self._nikki_mutable)

    def __repr__(self) -> str:
        kind = "mutable_tensor" if self._nikki_mutable else "tensor"
        return f"nt.{kind}" + (f"[{', '.join(map(str, self.shape))}]" if self.shape else "")


tensor = _TensorAnnotation()
# A kernel parameter the kernel may write in place (legacy: it must then also be returned).
mutable_tensor = _TensorAnnotation(mutable=True)
