"""dart_core: DART speculative decoding engine (and EAGLE-3 baseline), importable without Gradio.

    from dart_core import DartModel, dart_generate, TEMPLATE_REGISTRY
"""
__version__ = "0.1.0"

# Before anything imports torch: its OpenMP threads must sleep when idle, not spin on the native kernels' cores.
from .openmp import quiet_openmp  # noqa: E402

quiet_openmp()

from .models.templates import TEMPLATE_REGISTRY  # noqa: E402  (light: no torch)


def __getattr__(name):
    # The API pulls in torch and transformers: import it on first use, so `import dart_core`
    # (and the native modules) stay light.
    if name in ("DartModel", "dart_generate", "dart_generate_stream", "DartOutput", "DartStreamStep"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'dart_core' has no attribute {name!r}")


__all__ = ["DartModel", "dart_generate", "dart_generate_stream", "TEMPLATE_REGISTRY", "__version__"]
