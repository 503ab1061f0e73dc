"""The Triton adapters: one class per model (:mod:`.models`), BLS stages, responses, metrics,
and Triton 2.51's workarounds, one module per register row (:mod:`.compat`)."""
