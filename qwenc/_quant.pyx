# cython: language_level=3
"""Weight storage types: dequantization and quantization of rows (csrc/quant.c)."""
