"""rotary's conformance suite: ``python3 -m conformance`` from the repository root.

Runs :func:`rotary.testing.check_rope` on rotary itself and the cross-backend equivalence
of every public function, for every installed backend and float dtype, plus the golden
vectors in ``conformance/vectors/``; prints a report and writes it as JSON and a PNG heat
map (``--out DIR``, default ``conformance-report/``).  Exit code 1 on any failure.
"""
