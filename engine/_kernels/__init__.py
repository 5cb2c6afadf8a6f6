"""Kernels: whole-array building blocks that the engine, the differential layer and the
clients share (DESIGN.md §1). They import only numpy, pyarrow and pyroaring (and the
standard library), so any layer may use them; ``tests/engine/_kernels/test_imports.py``
pins that.

* :mod:`engine._kernels.hashing` — the one row hash and the one equality rule;
* :mod:`engine._kernels.hashmap` — the one vectorized ``uint64 -> int64`` hash map;
* :mod:`engine._kernels.keymap` — the one collision policy: hash, then verify the real
  key values, so two distinct keys never meet.
"""
