"""Paged-attention kernels (Triton) and their torch reference twins, one op per file."""
