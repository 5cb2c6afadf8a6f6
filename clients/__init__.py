"""Ticktable clients: the Python client, live pandas subscriptions, the PySpark data source.

Public names are re-exported by :mod:`ticktable` (``tt.connect``); import from there.
"""

from __future__ import annotations

from clients.client import Client as Client
from clients.client import connect as connect
from clients.remote import RemoteTable as RemoteTable

__all__ = ["Client", "RemoteTable", "connect"]
