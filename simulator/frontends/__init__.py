"""The ``simulate`` command and its subcommands."""
