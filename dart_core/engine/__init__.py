"""The decoding engine: the speculative loop, acceptance, draft trees, the Drafter protocol and the
per-step trace. It imports nothing of dart_core above it (tests/package/test_layout.py)."""
