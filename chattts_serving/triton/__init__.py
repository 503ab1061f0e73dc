"""The Triton adapters: one class per model, BLS stages, responses and metrics."""
