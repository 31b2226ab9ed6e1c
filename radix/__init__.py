"""Paged KV memory management: block pool, radix tree, block tables. Pure Python."""
