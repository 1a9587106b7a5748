"""Plumbing: array-namespace compatibility, types, argument validation, the one cache.

Nothing here knows RoPE; everything above imports from here.
"""
