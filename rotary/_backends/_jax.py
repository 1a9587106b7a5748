"""JAX: constants built at trace time, ``lax.scan`` for causal linear attention, jitted cores.

Under ``jax.jit`` every value is a tracer; the constants (frequency tables) are built
inside :func:`jax.ensure_compile_time_eval`, so they are concrete arrays that the cache
may keep and ``jit`` embeds, and only the positions stay traced.  Tracers are never cached.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from .._lib._cache import get_or_build
from .._lib._typing import Array, Device, DType
from .._math import _linear
from ._generic import Backend, ConstantBuilder
from ._scan import _pad_seq

__all__ = ["JaxBackend"]


def _tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


class JaxBackend(Backend):
    writable = False

    def creation_device(self, x: Array) -> Device:
        # Traced values have no device; sharded arrays report a sharding that jnp.asarray takes
        # too.  ``None`` lets jit place constants.
        sharding = getattr(x, "sharding", None)
        try:
            return sharding if sharding is not None and len(sharding.device_set) == 1 else None
        except Exception:  # tracers
            return None

    def has_int64(self, device: Device) -> bool:
        return bool(jax.config.jax_enable_x64)

    def float_dtypes(self, device: Device) -> set[str]:
        return {"float16", "bfloat16", "float32", *(("float64",) if jax.config.jax_enable_x64 else ())}

    def check_devices(self, arrays: list[tuple[str, Array]]) -> None:
        from .._lib._validation import check_same_device

        named = [(n, frozenset(a.devices())) for n, a in arrays if not _tracer(a) and hasattr(a, "devices")]
        if len(named) > 1:
            check_same_device([(n, sorted(str(d) for d in ds)) for n, ds in named])

    def is_concrete(self, x: Array) -> bool:
        if _tracer(x):
            return False
        try:
            return all(d.platform == "cpu" for d in x.devices())
        except Exception:
            return False

    def is_real(self, x: Array) -> bool:
        if isinstance(x, (tuple, list)):
            return all(self.is_real(a) for a in x)
        return not _tracer(x)

    def host_values(self, x: Array) -> Any:
        import numpy as np

        out = np.asarray(x)
        return out.astype(np.float32) if out.dtype.name == "bfloat16" else out

    def constant(
        self, build: ConstantBuilder, config: Hashable, kind: str, device: Device, dtype: DType
    ) -> Array:
        def make() -> tuple[Array, int, bool]:
            with jax.ensure_compile_time_eval():
                return self._built(build(config, kind, self.xp, device, dtype))

        return get_or_build((config, kind, "jax", str(device), str(dtype)), make)

    def causal_scan(
        self,
        chunks: _linear.Chunk,
        init: _linear.State,
        *,
        size: int,
        eps: float,
        device: Device,
        out_dtype: DType,
    ) -> tuple[Array, _linear.State]:
        """``lax.scan`` over the chunks: one traced chunk body, working memory of one chunk."""
        n = chunks.a.shape[-2]
        if n <= size:
            return super().causal_scan(chunks, init, size=size, eps=eps, device=device, out_dtype=out_dtype)
        pad = (-n) % size
        m = (n + pad) // size
        xs = []
        for t in chunks:
            t = _pad_seq(t, pad, jnp)
            t = jnp.reshape(t, (*t.shape[:-2], m, size, t.shape[-1]))
            xs.append(jnp.moveaxis(t, -3, 0))
        lead = jnp.broadcast_shapes(*(t.shape[1:-2] for t in xs[2:]))  # the keys' and values'

        def body(carry: _linear.State, x: tuple[Array, ...]) -> tuple[_linear.State, Array]:
            ch = _linear.Chunk(*x)
            out = _linear.chunk_output(ch, carry, eps, jnp, device)
            return _linear.add(carry, _linear.chunk_state(ch, jnp)), out.astype(out_dtype)

        S = jnp.broadcast_to(init.S, (*lead, *init.S.shape[-2:]))
        z = jnp.broadcast_to(init.z, (*lead, init.z.shape[-1]))
        final, outs = jax.lax.scan(body, _linear.State(S, z), tuple(xs))
        outs = jnp.moveaxis(outs, 0, -3)
        outs = jnp.reshape(outs, (*outs.shape[:-3], m * size, outs.shape[-1]))[..., :n, :]
        return outs, final

    def jit(self, fn: Callable[..., Any], static_argnums: tuple[int, ...]) -> Callable[..., Any]:
        def make() -> tuple[Callable[..., Any], int, bool]:
            return jax.jit(fn, static_argnums=static_argnums), 1024, True

        return get_or_build(("jit", fn, static_argnums), make)  # type: ignore[no-any-return]
