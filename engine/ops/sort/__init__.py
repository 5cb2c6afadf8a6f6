"""``sort``: a live table's rows in the order of one or more key columns.

Modules: :mod:`.listener` (the verb and :class:`SortListener`), :mod:`._keys` (sort keys
as order-preserving ``uint64`` codes), :mod:`._index` (rows in sort order on a gapped
slot space), :mod:`._room` (where it finds room when new rows do not fit their gap) and
:mod:`._slots` (its vectorized building blocks).
"""

from engine.ops.sort._keys import SORTABLE as SORTABLE
from engine.ops.sort._keys import sortable as sortable
from engine.ops.sort.listener import RedirectedColumnSource as RedirectedColumnSource
from engine.ops.sort.listener import SortedTable as SortedTable
from engine.ops.sort.listener import SortListener as SortListener
from engine.ops.sort.listener import sort as sort

__all__ = ["SORTABLE", "RedirectedColumnSource", "SortListener", "SortedTable", "sort", "sortable"]
