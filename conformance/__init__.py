"""rotary's conformance kit: ``python -m conformance`` (``--help`` for the options).

Shipped in the wheel beside ``rotary``, so it runs from any folder and tests whichever
``rotary`` is imported (the report names its version and path).

* Without ``--against``: :func:`rotary.testing.check_rope` on rotary itself and the
  cross-backend equivalence of every public function, for every installed backend and float
  dtype, plus the golden vectors in ``conformance/vectors/``; prints a report and writes it as
  text, JSON and a PNG heat map (``--out DIR``, default ``conformance-report/``).
* ``--against MODULE:FUNCTION``: ``check_rope`` and the golden vectors on another project's
  RoPE function ``fn(x, pos)`` (see :mod:`conformance.against`), for its own CI.

Exit status 0 when everything passes, 1 on any failure, 2 on a usage error.
"""
