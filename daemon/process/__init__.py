"""The daemon process: its logging and its host resources (CPU threads, heap, huge pages)."""
