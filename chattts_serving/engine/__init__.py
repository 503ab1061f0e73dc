"""The GPT engine: in-flight batching with a resident KV cache, ChatTTS' sampler, the GPT step runner."""
