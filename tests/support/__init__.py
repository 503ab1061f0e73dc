"""Helpers the tests share, one module per kind:

- :mod:`.servers`: real tritonservers and gateways (render a profile with overrides, start, stop,
  scan the log), free ports, waits on a condition;
- :mod:`.fake_triton`, :mod:`.bls_fakes`: the in-process Triton host and stand-in BLS objects;
- :mod:`.inprocess`, :mod:`.engine_helpers`: in-process pipeline stages and engine parts;
- :mod:`.requests`, :mod:`.streams`: requests to a real server's ``chattts`` (and the bad inputs
  every door refuses), one gRPC stream in a thread;
- :mod:`.chattts_ref`: the upstream ChatTTS reference;
- :mod:`.pg`: a throwaway PostgreSQL; :mod:`.browser`: headless Chromium for the page;
- :mod:`.admin_calls`, :mod:`.probe_cli`: the restricted-API call tables and the probe's
  command line, shared by unit and server tests."""
