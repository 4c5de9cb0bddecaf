"""The benchmark: decoding methods on Spec-Bench-format question files (``python -m dart_core.bench``)."""
