"""The command line: one module per area, each `register(subparsers)` for the commands `tapebench.cli.COMMANDS`
lists. The top layer: a command module may import any layer below, nothing imports it but `tapebench.cli`."""
