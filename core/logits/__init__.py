"""Logits processing: what changes a request's next-token logits before the sampler draws
(penalties, logit_bias, min_tokens, structured-output grammars), backend-neutral as numpy."""
