"""What a request asks of sampling (SamplingParams) and what logits processors hand a sampler
(adjustments): plain data every layer and backend may import."""
