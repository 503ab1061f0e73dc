"""Text to prompt: normalisation, sentence segments, the front end, refine-text prompts, voices."""
