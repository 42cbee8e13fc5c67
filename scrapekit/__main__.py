"""``python -m scrapekit`` runs the command line."""

from .cli import main

main()
