"""`python -m geolens ...` runs the command-line interface (the same as the `geolens` script)."""

from geolens.cli import main

main()
