"""``python -m dart_core.train {dart,eagle3,features}``: the training command line (training/cli.py).

The one module outside ``training/`` that imports it: the engine, app and bench never need torch's
training machinery."""
import sys

from .training.cli import main

if __name__ == "__main__":
    sys.exit(main())
