"""The types of ``rotary``'s signatures, named once.

Arrays, namespaces, devices and dtypes come from many libraries and have no common
static type yet (as in ``array-api-extra``), so they are ``Any`` under a readable name;
options are ``Literal`` types.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Literal, Protocol, TypeAlias

__all__ = [
    "AngleMethod",
    "Array",
    "DType",
    "Device",
    "FeatureMapName",
    "Layout",
    "Namespace",
    "PartialMode",
    "RotaryEmbedding",
    "Similarity",
]

#: An array of any supported library (NumPy, CuPy, torch, JAX, Dask, array-api-strict).
Array: TypeAlias = Any
#: An array-API namespace (``array_api_compat.numpy``, ``jax.numpy``, ...).
Namespace: TypeAlias = ModuleType
#: A device object of some array library (``None`` lets the library choose).
Device: TypeAlias = Any
#: A dtype object of some array library.
DType: TypeAlias = Any

#: Pairing of features: ``"half"`` pairs ``i`` with ``i + r/2``, ``"interleaved"`` ``2i`` with ``2i + 1``.
Layout = Literal["half", "interleaved"]
#: Angle method: exact range reduction, or the common float32 recipe.
AngleMethod = Literal["exact", "float32"]
#: How ``rotary_dim < head_dim`` is read.
PartialMode = Literal["neox", "proportional"]
#: Named feature maps of linear attention.
FeatureMapName = Literal["elu+1", "relu", "softplus", "identity"]
#: Similarity of linear attention.
Similarity = Literal["dot", "cosine"]


class RotaryEmbedding(Protocol):
    """What :func:`rotary.attention` and :func:`rotary.linear_attention` need of ``rope=``:
    :class:`rotary.RoPE`, :class:`rotary.AxialRoPE` and :class:`rotary.MRoPE` all qualify."""

    @property
    def head_dim(self) -> int: ...

    def rotate(self, x: Array, pos: Any) -> Array: ...

    def apply(self, q: Array, k: Array, pos: Any, *, k_pos: Any = None) -> tuple[Array, Array]: ...
