"""Ticktable clients: the Python client, live pandas subscriptions, the PySpark data source.

Public names are re-exported by :mod:`ticktable` (``tt.connect``); import from there.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from clients.client import Client as Client
    from clients.client import connect as connect
    from clients.remote import RemoteTable as RemoteTable

__all__ = ["Client", "RemoteTable", "connect"]

_WHERE = {"Client": "clients.client", "connect": "clients.client", "RemoteTable": "clients.remote"}


def __getattr__(name: str) -> object:
    # loaded on first use: the CLI's commands (clients.commands) build their parser without
    # importing the client (pandas), so ``ticktable health`` stays light
    if name not in _WHERE:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
