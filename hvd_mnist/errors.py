"""The one exception type that the CLI turns into a one-line error and a non-zero exit."""


class UserError(Exception):
    """A problem with the user's input (flags, files, directories), not a bug in hvd_mnist."""
