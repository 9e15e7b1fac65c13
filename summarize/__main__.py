"""`python -m summarize`: the `summarize` command."""
import sys

from summarize.cli import main

if __name__ == "__main__":
    sys.exit(main())
