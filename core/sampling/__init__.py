"""What a request asks of sampling (SamplingParams), what logits processors hand a sampler
(adjustments), and the sampling rule itself on numpy arrays (rule, with NumpySampler over it):
plain data and arithmetic every layer and backend may import."""
