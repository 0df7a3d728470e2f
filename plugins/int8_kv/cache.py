"""PagedInt8KVCache: the paged cache (blocks, prefix cache, copy-on-write) over int8 storage.

Block bookkeeping does not care what a slot holds, so the paged cache is reused as it is; what
changes is the storage it is built on (registered as storage format "int8") and the declaration
that its reads only approximate its writes (LossyKV), which the conformance suite reads."""
from __future__ import annotations

from qwen_serve.kv.paged import PagedKVCache


class PagedInt8KVCache(PagedKVCache):
    exact_counterpart = "paged"  # LossyKV: the float cache with the same layout
