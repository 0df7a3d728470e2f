"""Weight quantization: the canonical int4 format and the calibration that weighs it."""
