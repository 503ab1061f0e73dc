"""Tokens to sound: the chunk schedule of a stream, the vocoder runners, output formats."""
