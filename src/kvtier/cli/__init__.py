"""The ``kvtier`` command line: a thin shell over the library (see :mod:`kvtier.cli.main`)."""
