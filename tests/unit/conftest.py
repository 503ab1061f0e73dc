"""Tests that need no server: in process, Triton's Python backend stood in by
``tests/support/fake_triton.py`` where a model is under test. ``make unit`` runs this folder."""
