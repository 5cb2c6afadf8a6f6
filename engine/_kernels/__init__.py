"""Kernels: whole-array building blocks that the engine, the differential layer and the
clients share (DESIGN.md §1). They import only numpy, pyarrow and pyroaring (and the
standard library), so any layer may use them; ``tests/engine/_kernels/test_imports.py``
pins that.

* :mod:`engine._kernels.hashing` — the one row hash and the one equality rule;
* :mod:`engine._kernels.hashmap` — the one vectorized ``uint64 -> int64`` hash map;
* :mod:`engine._kernels.keymap` — the one collision policy: hash, then verify the real
  key values, so two distinct keys never meet;
* :mod:`engine._kernels.sortedmap` — the same ``uint64 -> int64`` map as sorted arrays
  (searches instead of probe rounds) for sparse row keys, up to about a hundred thousand;
* :mod:`engine._kernels.rowkeymap` — the one row key -> slot map (dense array while keys
  are dense, sorted arrays, then the hash map when sparse; one switch-over rule), with
  shifts as ranges;
* :mod:`engine._kernels.ids` — the one id allocator (frees reusable from the next cycle);
* :mod:`engine._kernels.grow` — dense arrays that grow in place in reserved address space;
* :mod:`engine._kernels.arrays` — array helpers written once (sorted unique, membership,
  range expansion, key shifts, bit scans, bitmaps from keys or ranges, the numeric view).
"""
