"""The one exception type geolens raises for bad input; the CLI prints it as a one-line error."""


class GeoError(Exception):
    """A user-facing error: the message names the problem and the fix."""
