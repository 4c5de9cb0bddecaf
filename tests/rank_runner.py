"""``python -m dart_core.train`` for the torchrun tests (tests/training/test_training_ranks.py), with one rank killed on
request: when RANK equals KILL_RANK, the function KILL_PATCH ("module:name") sends that process SIGKILL at its
KILL_AT_CALL-th call, as an out-of-memory kill or a lost node would, with no chance to clean up."""
import importlib
import os
import signal
import sys

from dart_core.training.cli import main

if os.environ.get("KILL_RANK") is not None and os.environ["RANK"] == os.environ["KILL_RANK"]:
    module, name = os.environ["KILL_PATCH"].split(":")
    mod = importlib.import_module(module)
    real, calls = getattr(mod, name), [0]

    def dies_at_call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(os.environ["KILL_AT_CALL"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    setattr(mod, name, dies_at_call)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
