"""`python -m handler.summarize`: the `summarize` command."""
import sys

from handler.summarize.cli import main

if __name__ == "__main__":
    sys.exit(main())
