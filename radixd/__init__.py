"""radixd: a prefix-caching LLM serving daemon.

The import package ``radixd`` gathers the top-level source folders ``radix/``, ``kernels/`` and
``daemon/`` as ``radixd.radix``, ``radixd.kernels`` and ``radixd.daemon`` (see README, "Layout").
"""

__version__ = "0.1.0"
