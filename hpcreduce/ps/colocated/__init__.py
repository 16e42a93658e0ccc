"""The colocated layout: embedding shards on every trainer rank, rows exchanged between them.

``ColocatedTables`` (``shards``) offers ``ps.Worker``'s multi-table row calls with no server
ranks; ``store`` adapts the row store, ``layout`` places rows and replicas, ``routes`` orders
the items, ``flat`` moves them in flat buffers, ``exchange`` sends headers with items,
``handles`` completes the calls. See docs/parameter-server.md, "Colocated layout".
"""
from .shards import ColocatedTables, default_init

__all__ = ["ColocatedTables", "default_init"]
