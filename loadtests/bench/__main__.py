"""``python -m loadtests.bench``."""

from .cli import main

main()
