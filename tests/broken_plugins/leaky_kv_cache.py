"""A deliberately broken KV cache for testing the conformance suite: releasing a sequence
keeps one of its blocks forever."""
from qwen_serve.hookspecs import hookimpl
from qwen_serve.kv.paged import PagedKVCache


class LeakyKVCache(PagedKVCache):
    def free(self, seq_id):
        table = list(self.block_table(seq_id))
        if len(table) > 1:
            self.pool.retain(table[0])  # the bug: one block is never given back
        super().free(seq_id)


@hookimpl
def register_kv_caches(register):
    register("leaky", lambda storage, config: LeakyKVCache(storage, config.block_size, config.kv_blocks,
                                                            prefix_caching=config.prefix_cache))
