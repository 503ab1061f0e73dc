"""Helpers the tests share: real servers (:mod:`.servers`), the in-process Triton host
(:mod:`.fake_triton`), in-process pipeline stages (:mod:`.inprocess`), engine helpers, the
ChatTTS reference (:mod:`.chattts_ref`) and a throwaway PostgreSQL (:mod:`.pg`)."""
