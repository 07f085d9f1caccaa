"""opforge's kernel families. Each has its C++/CUDA sources under ``csrc/``, its
implementations as Extensions (``extensions.py``), its loader and a torch reference."""
