"""The n-gram (prompt lookup) proposer plugin (qwen_serve.plugins.ngram)."""
