"""``tt.spark``: the PySpark side of Ticktable (needs the ``spark`` extra and Java 17).

Imported on first use of ``tt.spark`` so ``import ticktable`` never needs pyspark. See
:mod:`clients.spark` for the ``format("ticktable")`` data source's options.
"""

from __future__ import annotations

from clients.spark import FORMAT as FORMAT
from clients.spark import TicktableDataSource as TicktableDataSource
from clients.spark import local_session as local_session
from clients.spark import push as push
from clients.spark import register as register

__all__ = ["FORMAT", "TicktableDataSource", "local_session", "push", "register"]
