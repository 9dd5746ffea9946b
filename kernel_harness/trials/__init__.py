"""The trial tree: every attempt at a kernel, its parent, strategy and numbers.

``trials/<name>/state.json`` is the single source of truth; each saved trial's
sources live in ``trials/<name>/<id>/``.  See :mod:`.store` for the
crash-safety rules.
"""
