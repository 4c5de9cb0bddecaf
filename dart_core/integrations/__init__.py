"""Bridges to other engines. Each module here imports its engine only inside itself (``vllm_plugin`` and
``vllm_model``: vLLM, an optional extra), so the rest of dart_core never needs them."""
