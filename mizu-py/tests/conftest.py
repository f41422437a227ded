import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Workers are fresh interpreters: they import task functions from this directory.
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
sys.path.insert(0, HERE)
