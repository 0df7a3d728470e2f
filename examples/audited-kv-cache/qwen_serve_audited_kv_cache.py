"""An example third-party plugin: the paged KV cache, re-checking its block accounting after
every call that changes it. Slower, and loud the moment an invariant breaks, which is what a
researcher changing eviction or sharing rules wants.

Written only against qwen-serve's public API: the hook marker, the PagedKVCache class and the
EngineConfig it is built from. Installed, it is found through the `qwen_serve` entry point:

    pip install -e examples/audited-kv-cache
    python -m qwen_serve --kv-cache audited-paged
    python -m pytest --pyargs qwen_serve.conformance --kv-cache audited-paged
"""
from __future__ import annotations

from collections import Counter

from qwen_serve.config import EngineConfig
from qwen_serve.hookspecs import hookimpl
from qwen_serve.kv.paged import PagedKVCache


class AccountingError(AssertionError):
    pass


class AuditedPagedKVCache(PagedKVCache):
    def allocate_slots(self, seq_id, start, num_tokens, expected_total=0):
        ok = super().allocate_slots(seq_id, start, num_tokens, expected_total)
        self.audit()
        return ok

    def free(self, seq_id):
        super().free(seq_id)
        self.audit()

    def match_prefix(self, seq_id, token_ids):
        reused = super().match_prefix(seq_id, token_ids)
        self.audit()
        return reused

    def fork(self, parent_id, child_id):
        super().fork(parent_id, child_id)
        self.audit()

    def audit(self) -> None:
        usage = self.usage()
        if usage.used + usage.free != usage.total:
            raise AccountingError(f"used {usage.used} + free {usage.free} != total {usage.total} blocks")
        holders = Counter(block for seq_id in self.sequence_ids() for block in self.block_table(seq_id))
        for block, ref in enumerate(self.pool.ref_cnt):
            if ref != holders.get(block, 0):
                raise AccountingError(f"block {block}: ref count {ref} but held by {holders.get(block, 0)} sequences")


@hookimpl
def register_kv_caches(register):
    def make(storage, config: EngineConfig) -> AuditedPagedKVCache:
        return AuditedPagedKVCache(storage, config.block_size, config.kv_blocks, prefix_caching=config.prefix_cache)

    register("audited-paged", make)
