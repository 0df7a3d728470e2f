"""Speculative decoding: proposers guess the next tokens, one batched forward verifies them."""
