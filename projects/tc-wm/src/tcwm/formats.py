"""Placeholder until the format readers land."""


class DataFormatError(ValueError):
    """The data do not have the shape or values this project needs."""

    user_facing = True
