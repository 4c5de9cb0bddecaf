"""RoPE's cos / sin rows for the native decoder tests: the HF layout (each half of a head rotated by the same
frequencies), base 10000, float32."""
import numpy as np


def rope_tables(positions, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [len(positions), head_dim] float32, C-contiguous."""
    half = head_dim // 2
    angles = np.asarray(positions)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    cos = np.ascontiguousarray(np.tile(np.cos(angles), 2), dtype=np.float32).reshape(len(angles), head_dim)
    sin = np.ascontiguousarray(np.tile(np.sin(angles), 2), dtype=np.float32).reshape(len(angles), head_dim)
    return cos, sin
