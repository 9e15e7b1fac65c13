"""The RunPod Hub's entry file (the Hub asks for a handler.py in .runpod/ or the root).
The worker is the `handler` package: the image runs `python -m handler` through
docker/start.sh, and running this file does the same, from the image or a checkout."""
import os
import runpy
import sys

if __name__ == "__main__":
    # this folder first on sys.path would make `import handler` find this file, not the package
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runpy.run_module("handler", run_name="__main__", alter_sys=True)
