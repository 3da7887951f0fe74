"""Fast model paths the target may use: the lean forward (``lean``, what it covers: ``lean_support``), the matmul
kinds (``matmul``) and their compiled kernel (``kernel``, ``csrc/``), and the KV-cache layer (``kv_cache``). Nothing
here knows about drafting or verification."""
