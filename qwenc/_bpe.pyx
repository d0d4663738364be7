# cython: language_level=3
"""Byte-pair-encoding merge loop (csrc/bpe.c)."""
