"""``python -m edgecap`` runs the command line."""

from edgecap.cli import main

main()
