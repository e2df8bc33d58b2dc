"""Headless ``attnscope`` subcommands, one module each (see :mod:`core.cli`)."""
