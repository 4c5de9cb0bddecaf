"""Keep torch's idle OpenMP threads off the cores while the native kernels run.

On a CPU the decoder, the LM head and the draft heads run in native code on their own thread pool, but a few small
torch operations still run between them (concatenating the aux features, indexing rows of them). When torch runs one
of those in parallel, its OpenMP worker threads then wait for the next parallel region by spinning: GNU OpenMP (the
runtime the Linux torch wheels load) spins 300,000 times before it sleeps, about 11 ms of a core on the CPU measured
here (tests/native/test_openmp.py), on the very cores the native pool needs.
Measured on a 2-vCPU AMD EPYC (Zen 5, AVX-512), the bundled SmolLM2-135M in bf16, 2 threads, DART at budget 4 on
GSM8K questions: a 5-node verify took 14.3 ms in place against 8.6 ms for a plain step (1.67x); with idle OpenMP
threads put to sleep at once it took 9.3 ms against 8.4 (1.10x). Plain decoding hardly changed (it runs fewer torch
operations a step).

Not sleeping at once, though: a bounded spin of 10,000 turns (about 0.4 ms) decoded as fast as OMP_WAIT_POLICY=PASSIVE
(5-node verify 1.15-1.23x a plain step against 1.16-1.19x, two runs each) while training a DART head on the CPU, where
torch's parallel operations follow each other closely, kept its speed: 2.81 s a step against 2.70-2.75 with the
default spin and 3.30-3.41 with PASSIVE (`python -m dart_core.train dart --target bundled --max-steps 30`, same
machine). So GNU OpenMP gets GOMP_SPINCOUNT=10000; the Intel and LLVM runtimes (macOS wheels), which spin 200 ms by
default and have no spin count, get KMP_BLOCKTIME=0 (sleep at once; not measured here).

The OpenMP runtime reads its settings once, when torch loads it, so this must happen before ``import torch``:
``import dart_core`` does it (see :func:`quiet_openmp`), and :func:`openmp_advice` says what to do when torch was
imported first.
"""
from __future__ import annotations

import os
import sys

#: What dart_core sets when nothing chose: a short spin for GNU OpenMP (the Linux torch wheels), sleep at once for the
#: Intel / LLVM runtimes (each runtime ignores the other's variable).
SETTINGS = {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "0"}
#: Settings by which a user (or a launcher) already chose how OpenMP threads wait: any of them is left alone.
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

_state = {"applied": False, "warned": False}


def user_chose(environ=os.environ) -> bool:
    """Whether the environment already says how OpenMP threads wait."""
    return any(environ.get(name) for name in USER_SETTINGS)


def quiet_openmp(environ=os.environ, modules=sys.modules) -> bool:
    """Set :data:`SETTINGS` for the OpenMP runtime torch will load, unless the user chose how its threads wait or
    torch is already imported (its runtime has read its settings). Returns whether it set them."""
    if user_chose(environ) or "torch" in modules:
        return False
    environ.update(SETTINGS)
    if environ is os.environ:
        _state["applied"] = True
    return True


def openmp_advice(environ=os.environ, applied: bool | None = None) -> str | None:
    """What to do when torch's OpenMP threads may spin beside the native kernels (torch was imported before
    dart_core, and nothing chose a wait policy); None when they sleep as they should. ``applied``: whether
    :func:`quiet_openmp` set the policy in time (default: what it did at ``import dart_core``)."""
    if (_state["applied"] if applied is None else applied) or user_chose(environ):
        return None
    return ("torch was imported before dart_core, so torch's OpenMP threads spin for milliseconds after each "
            "parallel torch operation, on the cores the native kernels use (a DART verify measured up to 1.6x "
            "slower). Import dart_core before torch, or set GOMP_SPINCOUNT=10000 (or OMP_WAIT_POLICY=PASSIVE) in the "
            "environment.")


def wait_policy(environ=os.environ) -> str:
    """How idle OpenMP threads wait in this process, for reports: the settings that decide it, or "spin (OpenMP's
    default)" when nothing does (torch imported before dart_core)."""
    chosen = [f"{name}={environ[name]}" for name in USER_SETTINGS if environ.get(name)]
    return ", ".join(chosen) if chosen else "spin (OpenMP's default)"


def warn_if_spinning(log) -> None:
    """Log :func:`openmp_advice` once per process (the native CPU forward calls this when it is built)."""
    advice = openmp_advice()
    if advice and not _state["warned"]:
        _state["warned"] = True
        log.warning(advice)


__all__ = ["SETTINGS", "USER_SETTINGS", "openmp_advice", "quiet_openmp", "user_chose", "wait_policy",
           "warn_if_spinning"]
