"""The table operations, one family per module or package (DESIGN.md §3).

Every operation is a listener that turns its parents' updates into its child's update,
at a cost that follows the change. Reading order: :mod:`engine.ops.filter` (the model
for the rest), :mod:`engine.ops.select`, :mod:`engine.ops.slice`, :mod:`engine.ops.merge`,
:mod:`engine.ops.snapshot`, then the packages :mod:`engine.ops.sort`,
:mod:`engine.ops.aggregate` and :mod:`engine.ops.join`, each exposing its verbs from its
``__init__``. Every operation builds its child through :func:`engine.table.derive`.
"""
