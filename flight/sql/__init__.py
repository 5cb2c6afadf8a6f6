"""SQL on Ticktable (DESIGN.md §10).

Reading order: :mod:`flight.sql.parse` (text to one sqlglot statement, the tables it
reads, its kind), then :mod:`flight.sql.views` (a ``SELECT`` compiled to the engine's
incremental operations: a live view).
"""
