"""RoFormer linear attention with RoPE (paper eq. 19), the field's decay and gates, its state, and their
algebra.  With ``similarity="dot"`` (normalised, the default)::      out_i = sum_j w_ij [R_i phi(q_i)]^T
[R_j phi(k_j)] v_j / sum_j w_ij phi(q_i)^T phi(k_j)  RoPE rotates the features in the numerator only;
the denominator stays unrotated (and positive).  ``w_ij = 1`` (RoFormer), or the decay between the two
tokens: ``w_ij = prod_{s=j+1..i} a_s`` with ``a_s = decay * exp(log_gate_s)`` (RetNet's per-head
``decay``, GLA's and Mamba-2's per-token gates).  ``normalize=False`` drops the denominator (fla's
``normalize=False``, RetNet, GLA, Mamba-2).  With ``similarity="cosine"`` the similarity is ``1 + (R_i
q^)^T (R_j k^)`` (unit vectors, zero vectors map to 0) in numerator and denominator.  The denominator
has no floor: the query features are scaled per token (the output does not depend on their scale: elu+1
in the log domain, other maps by their largest feature), and a denominator of exactly 0 (a query whose
features are all 0, or that sees no key) gives 0.  The state ``(S, z, offset, log_decay)``: ``S = sum_j
w_j b_j v_j^T`` over the numerator key features ``b_j`` (rotated ``phi(k_j)``), ``z = sum_j w_j e_j``
over the denominator ones (unrotated; ``None`` unnormalised), each key weighted by its decay to the end
of the block; ``log_decay`` the block's total (``None``: no decay).  States of consecutive key blocks
combine: ``a + b`` (``a`` first) is ``exp(b.log_decay) a + b`` (a plain sum without decay), so per-block
states, their exclusive prefix sums and ``causal=True, state=prefix`` per block give the rows of one
call on the whole sequence.  A given state always means "keys before these ones, all visible", decayed
up to the first of these tokens.  Non-causal: the key-value summary, ``O(N d d_v)``; with decay, each
query sees the keys on both sides, weighted by the gates between them (two causal passes).  Causal: the
sequence streams through the backend's :meth:`~rotary._backends.Backend.scan` in parts (chunks of ``C =
chunk_size`` tokens, a masked quadratic form inside a chunk, the chunk states combined in one matrix
product), so feature maps and rotations are applied part by part and the working memory is one part's,
whatever the length: a loop writing into one output (NumPy, torch, CuPy, array-api-strict), ``lax.scan``
(JAX), the whole sequence at once under ``torch.compile`` (one graph for every length), a chain of
blocks (Dask).  Running sums in float32 or better; the output in the input dtype.  The package, one idea
per file, nothing importing upward: ``_state`` (the state and how states combine), ``_args`` (arguments,
gates and the families' keywords, checked), ``_parts`` (a part's features and rotations), ``_documents``
(packed documents' states and offsets), ``_causal`` (the additive families' passes), ``_decode``
(decoding shortcuts), ``_checks`` (the checks kept per signature), ``_families`` (the recurrent families
through :mod:`rotary._math._recurrence`), ``_api`` (the public functions).
"""

from ._api import linear_attention, linear_attention_state
from ._args import FEATURE_MAPS
from ._state import LinearAttentionState, combine

__all__ = ["FEATURE_MAPS", "LinearAttentionState", "combine", "linear_attention", "linear_attention_state"]
