"""dart_core puts torch's idle OpenMP threads to sleep after a short spin (dart_core/openmp.py): set before torch loads, the user's own
choice kept, advice when it is too late."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from dart_core import openmp


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in openmp.USER_SETTINGS}


def run(code: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_quiet_openmp_sets_the_policy_before_torch_only():
    env: dict = {}
    assert openmp.quiet_openmp(env, modules={}) is True
    assert env == {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "0"}
    late: dict = {}
    assert openmp.quiet_openmp(late, modules={"torch": object()}) is False     # the runtime has read its settings
    assert late == {}


@pytest.mark.parametrize("name,value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "1000"),
                                        ("KMP_BLOCKTIME", "200")])
def test_the_users_choice_is_kept(name, value):
    env = {name: value}
    assert openmp.quiet_openmp(env, modules={}) is False
    assert env == {name: value}
    assert openmp.openmp_advice(env, applied=False) is None


def test_advice_when_torch_came_first():
    advice = openmp.openmp_advice({}, applied=False)
    assert "Import dart_core before torch" in advice and "GOMP_SPINCOUNT=10000" in advice
    assert openmp.openmp_advice({}, applied=True) is None


def test_import_dart_core_sets_it_for_the_process():
    show = "import os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    assert run("import dart_core; " + show, clean_env()) == "10000 None"
    assert run("import dart_core; " + show, {**clean_env(), "OMP_WAIT_POLICY": "ACTIVE"}) == "None ACTIVE"
    assert run("import torch, dart_core; " + show, clean_env()) == "None None"


def test_the_lean_forward_warns_once_when_torch_came_first(caplog, monkeypatch):
    monkeypatch.setitem(openmp._state, "applied", False)
    monkeypatch.setitem(openmp._state, "warned", False)
    for name in openmp.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    log = logging.getLogger("test_openmp")
    with caplog.at_level(logging.WARNING, logger="test_openmp"):
        openmp.warn_if_spinning(log)
        openmp.warn_if_spinning(log)
    assert [r.getMessage() for r in caplog.records] == [openmp.openmp_advice(applied=False)]


# What the setting is for: after a parallel torch operation, torch's OpenMP worker must not keep a core busy.
# Measured as the process's CPU time while the main thread sleeps (the worker's spinning is all there is).
SPIN_PROBE = """
import time, sys
{first}
import torch
torch.set_num_threads(2)
x = torch.ones(1 << 22)
for _ in range(3):
    (x * 2).sum()               # parallel regions: the worker joins them, then waits for the next
t = time.process_time()
time.sleep(0.2)
print(round((time.process_time() - t) * 1e3, 1))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores: the OpenMP worker thread")
def test_idle_openmp_threads_sleep_after_import_dart_core():
    quiet = float(run(SPIN_PROBE.format(first="import dart_core"), clean_env()))
    spinning = float(run(SPIN_PROBE.format(first=""), {**clean_env(), "OMP_WAIT_POLICY": "ACTIVE"}))
    # ACTIVE spins through the whole 200 ms sleep; dart_core's setting spins about 0.4 ms, then sleeps
    assert spinning > 100.0, spinning
    assert quiet < 20.0, quiet


def test_reports_name_the_wait_policy():
    assert openmp.wait_policy({"OMP_WAIT_POLICY": "PASSIVE"}) == "OMP_WAIT_POLICY=PASSIVE"
    assert openmp.wait_policy({"GOMP_SPINCOUNT": "0"}) == "GOMP_SPINCOUNT=0"
    assert openmp.wait_policy(dict(openmp.SETTINGS)) == "GOMP_SPINCOUNT=10000, KMP_BLOCKTIME=0"
    assert openmp.wait_policy({}) == "spin (OpenMP's default)"
    from dart_core.hardware import describe_machine
    assert describe_machine()["openmp_wait"] == openmp.wait_policy()
