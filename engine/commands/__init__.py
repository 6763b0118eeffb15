"""CLI subcommands: each module has `add_arguments(parser)` and `run(args) -> int`, imports heavy things inside `run`."""
