"""The exception geolens raises for bad input and the warning it gives for odd settings; the CLI prints
each as one line."""


class GeoError(Exception):
    """A user-facing error: the message names the problem and the fix."""


class GeoWarning(UserWarning):
    """A setting or state that works but is probably not what was meant; the CLI prints it as one line."""


def warn(message: str) -> None:
    """Issue a GeoWarning (`warning: <message>` on the command line)."""
    import warnings

    warnings.warn(message, GeoWarning, stacklevel=2)


class GeoAttributeError(GeoError, AttributeError):
    """An attribute a model does not have for a reason worth one line (e.g. TransformerLens's ln_final
    asked of a post-norm model); an AttributeError, so hasattr() still answers False."""
