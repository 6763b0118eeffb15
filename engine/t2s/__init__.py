"""The text-to-semantic (GPT) stage: the official reference loops (``decoding``), the fast static-cache
decoder (``fast``), its fused GPU kernels (``kernels``) and the opt-in CPU int8 path (``quantize``)."""
