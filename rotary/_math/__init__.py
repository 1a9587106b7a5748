"""Library-agnostic math, written once against the array API: frequencies, exact angles,
the rotation, and the algebra of RoPE linear attention."""
