"""JAX: constants built at trace time, ``lax.scan`` for causal linear attention, jitted cores.

Under ``jax.jit`` every value is a tracer; the constants (frequency tables) are built
inside :func:`jax.ensure_compile_time_eval`, so they are concrete arrays that the cache
may keep and ``jit`` embeds, and only the positions stay traced.  Tracers are never cached.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import array_api_compat.numpy as np_xp
import jax
import jax.numpy as jnp
import numpy as np

from .._lib._cache import fast_paths_enabled, get_or_build, register_library
from .._lib._typing import Array, Device, DType, Layout
from .._math import _linear
from .._math._rotation import rotate_pairs
from ._generic import Backend, ConstantBuilder, sized

__all__ = ["JaxBackend"]

#: Constants computed on the host (NumPy, float64 or correctly rounded values): the frequencies
#: and the exact method's digit tables.
_HOST_KINDS = frozenset({"inv_freq", "tables"})


def _tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)  # pyright: ignore[reportAttributeAccessIssue]


def _tracing() -> bool:
    """Inside ``jax.jit`` (or another JAX trace), where even ops on concrete arrays are traced."""
    try:
        from jax._src import core

        return not core.trace_state_clean()
    except Exception:  # private API moved: probe with an operation
        return _tracer(jnp.zeros(()) + 0)


def _clean() -> bool:
    """No JAX trace or transformation.  (A default-device override is plain too: a constant
    built for ``device=None`` lands there, and is keyed by it, :meth:`JaxBackend.constant`.)"""
    return not _tracing()


register_library("jax", clean=_clean)


class JaxBackend(Backend):
    writable = False

    def owned(self, x: Array) -> Array:
        return x  # (immutable: no caller can keep or write a part of another array)

    def creation_device(self, x: Array) -> Device:
        # Traced values have no device; sharded arrays report a sharding that jnp.asarray takes
        # too.  ``None`` lets jit place constants.
        sharding = getattr(x, "sharding", None)
        try:
            return sharding if sharding is not None and len(sharding.device_set) == 1 else None
        except Exception:  # tracers
            return None

    @staticmethod
    def _stacked(pos: Any) -> Any:
        """A Python sequence holding JAX arrays or tracers (``jit`` over scalar positions) as one array."""
        if isinstance(pos, (list, tuple)) and any(
            isinstance(a, jax.Array) for a in jax.tree_util.tree_leaves(pos)
        ):
            return jnp.asarray(pos)
        return pos

    def position_shape(self, pos: Any, *, name: str) -> tuple[Any, ...]:
        return super().position_shape(self._stacked(pos), name=name)

    def positions(self, pos: Any, *, name: str, device: Device) -> tuple[Array, tuple[int, int] | None]:
        return super().positions(self._stacked(pos), name=name, device=device)

    def to_device(self, host: Any, dtype: DType, device: Device) -> Array:
        if _tracing():
            return jnp.asarray(host, dtype=dtype)
        # an explicit transfer (jax.transfer_guard("disallow") forbids implicit ones only)
        return jax.device_put(host.astype(jnp.dtype(dtype)), device)

    def has_int64(self, device: Device) -> bool:
        return bool(jax.config.jax_enable_x64)  # pyright: ignore[reportAttributeAccessIssue]

    def searchsorted_ok(self, device: Device) -> bool:
        return True  # (its default index dtype follows x64: int32 without it)

    def float_dtypes(self, device: Device) -> set[str]:
        x64 = jax.config.jax_enable_x64  # pyright: ignore[reportAttributeAccessIssue]
        return {"float16", "bfloat16", "float32", *(("float64",) if x64 else ())}

    def check_devices(self, arrays: list[tuple[str, Array]]) -> None:
        from .._lib._validation import check_same_device

        named = [(n, frozenset(a.devices())) for n, a in arrays if not _tracer(a) and hasattr(a, "devices")]
        if len(named) > 1:
            check_same_device([(n, sorted(str(d) for d in ds)) for n, ds in named])

    def tracing(self) -> bool:
        return _tracing()

    def fast(self, *inputs: Any, grads: tuple[Any, ...] = ()) -> bool:
        """:func:`rotary.fast_paths` on, in any context: JAX's fast paths (the pair-major
        interleaved rotation, cos/sin materialised once, eager calls as one ``jit``) are ``jnp``
        programs, so every transformation (``grad``, ``jvp``, ``vmap``, ``jit``, export) applies
        to them as to the generic code (``tests/test_transforms.py``); the generic fast paths
        that read position values check :meth:`tracing` themselves."""
        return fast_paths_enabled()

    def is_concrete(self, x: Array) -> bool:
        if _tracer(x) or _tracing():
            return False
        try:
            return all(d.platform == "cpu" for d in x.devices())
        except Exception:
            return False

    def host_values(self, x: Array) -> Any:
        out = np.asarray(x)
        return out.astype(np.float32) if out.dtype.name == "bfloat16" else out

    def constant(
        self, build: ConstantBuilder, config: Hashable, kind: str, device: Device, dtype: DType
    ) -> Array:
        """A concrete constant (built inside :func:`jax.ensure_compile_time_eval`, so ``jit``
        embeds it), with no implicit host-to-device transfer (``jax.transfer_guard("disallow")``
        holds): tables computed on the host (:data:`_HOST_KINDS`) move in one explicit
        ``device_put``; the others run as a program of their own (their Python numbers are
        literals of it), giving the bits of JAX's own arithmetic (HF's float32 recipe)."""

        def make() -> tuple[Array, int]:
            with jax.ensure_compile_time_eval():
                if kind in _HOST_KINDS:
                    host = build(config, kind, np_xp, "cpu", np.dtype(dtype))
                    return sized(jax.device_put(host, device))
                return sized(jax.jit(lambda: build(config, kind, self.xp, device, dtype))())

        # (device None: the default device, which jax.default_device(...) may override)
        where = device if device is not None else ("default", jax.config.jax_default_device)  # pyright: ignore[reportAttributeAccessIssue]
        return get_or_build((config, kind, "jax", where, dtype), make, "constants")

    def scan(
        self,
        body: Callable[..., tuple[Any, Array | None]],
        carry: Any,
        src: _linear.Source,
        *,
        n: Any,
        block: int,
        additive: bool = False,
        sequential: bool = False,
        into: bool = False,
    ) -> tuple[Any, Array | None]:
        """``lax.scan`` over the whole parts: one traced body, working memory of one part.

        The first part runs before the scan, so the carried state takes its sharding from the
        data (a replicated initial state would not match a sharded one under ``jit``); a last,
        shorter part runs after it.  ``into``: unused (nothing is written in place).
        """
        if self._loop_free(n) or n <= 2 * block:
            return super().scan(body, carry, src, n=n, block=block, additive=additive, sequential=sequential)
        carry, first = body(carry, src.take(0, block, n))
        full = (n - block) // block
        stop = block + full * block
        xs: list[Any] = []
        for i, (_x, ax) in enumerate(zip(src.arrays, src.axes, strict=True)):
            if not src.sliced(i, n):
                xs.append(None)
                continue
            part = src.take(block, stop, n).arrays[i]
            assert part is not None
            ax = ax % part.ndim
            part = jnp.reshape(part, (*part.shape[:ax], full, block, *part.shape[ax + 1 :]))
            xs.append(jnp.moveaxis(part, ax, 0))

        def step(c: Any, x: tuple[Any, ...]) -> tuple[Any, Any]:
            arrays = tuple(a if xi is None else xi for a, xi in zip(src.arrays, x, strict=True))
            c, o = body(c, _linear.Source(arrays, src.axes))
            return c, o

        carry, outs = jax.lax.scan(step, carry, tuple(xs))
        pieces = [first]
        if outs is not None:
            outs = jnp.moveaxis(outs, 0, -3)
            pieces.append(jnp.reshape(outs, (*outs.shape[:-3], full * block, outs.shape[-1])))
        if stop < n:
            carry, last = body(carry, src.take(stop, n, n))
            pieces.append(last)
        if first is None:
            return carry, None
        arrays: list[Array] = [p for p in pieces if p is not None]
        lead = jnp.broadcast_shapes(*(p.shape[:-2] for p in arrays))
        arrays = [jnp.broadcast_to(p, (*lead, *p.shape[-2:])) for p in arrays]
        return carry, jnp.concatenate(arrays, axis=-2)

    def segment_add(self, acc: Array, x: Array, ids: Array) -> Array:
        moved = jnp.moveaxis(x, -2, 0)
        out = jax.ops.segment_sum(moved, ids, num_segments=acc.shape[-2], indices_are_sorted=True)
        return acc + jnp.moveaxis(out, 0, -2)

    def _loop_free(self, n: Any) -> bool:
        return not isinstance(n, int)  # symbolic length (jax.export)

    def rotate(self, x: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int) -> Array:
        if layout == "interleaved" and self.fast(x):
            return rotate_pairs(x, c, s, layout=layout, rotary_dim=rotary_dim, xp=self.xp, pairs_first=True)
        return super().rotate(x, c, s, layout=layout, rotary_dim=rotary_dim)

    def materialize(self, c: Array, s: Array) -> tuple[Array, Array]:
        # XLA would fuse the angle composition (six gathered tables, twelve flops) into the
        # rotation of every head: computed once per position instead (~1.3x on a 4k prefill)
        if not self.fast(c, s):
            return c, s
        # (XLA on the CPU drops optimization barriers; a scatter is never fused into its users)
        cs = jnp.stack([c, s])
        flat = jnp.reshape(cs, (-1,))
        idx = jnp.arange(flat.shape[0])
        out = jnp.zeros_like(flat).at[idx].set(flat, unique_indices=True, indices_are_sorted=True)
        out = jnp.reshape(out, cs.shape)
        return out[0], out[1]

    def jit_eagerly(self) -> bool:
        return not _tracing()

    def jit(self, fn: Callable[..., Any], static_argnums: tuple[int, ...]) -> Callable[..., Any]:
        def make() -> tuple[Callable[..., Any], int]:
            return jax.jit(fn, static_argnums=static_argnums), 1024

        return get_or_build(("jit", fn, static_argnums), make, "jit")
