"""The one error family shown to users: cli.py turns it into one line and exit code 2."""


class QuantkitError(Exception):
    """A user-facing error: bad input, a missing file, an unsupported model."""

    exit_code = 2


class RecipeError(QuantkitError):
    """A recipe that does not validate; the message names the file and the key path."""


class ModelError(QuantkitError):
    """A model that cannot be found, loaded or handled."""


class DataError(QuantkitError):
    """Calibration or evaluation text that cannot be used."""


class VerificationError(QuantkitError):
    """An artifact whose reload does not match the in-memory model."""


class OfflineError(QuantkitError):
    """Something needed the network and the network is not there."""
