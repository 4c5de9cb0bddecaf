"""dart_core: DART speculative decoding engine (and EAGLE-3 baseline), importable without Gradio."""
__version__ = "0.1.0"
