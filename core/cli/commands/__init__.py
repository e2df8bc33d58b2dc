"""Headless ``attnscope`` subcommands, one module each (see :mod:`attnscope.core.cli.main`)."""
