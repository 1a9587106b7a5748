"""Adapters for the engines people run, one module each (the protocol: :mod:`rotary.testing.engine`).

Each module defines ``NAME``, ``PYTHON``, ``INSTALL`` (the CPU install recipe), ``version()`` and
``build(config, *, layer_type, dtype)``; the engine itself is imported only inside them, so every
adapter imports without its engine.  Recipes name two folders: ``$ROTARY``, a checkout of rotary
(installed into the engine's venv for the checker), and ``$ENGINES``, where each engine gets its
own venv (``$ENGINES/<module>/venv``: the field report's ``--venvs``).

``python -m conformance.engines`` runs the field report (:mod:`conformance.engines.field`);
:mod:`conformance.engines.cases` holds its case matrix and :mod:`conformance.engines.findings`
what it found.
"""
