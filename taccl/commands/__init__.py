"""One module per `taccl` subcommand; each exposes `register(subparsers)` (see taccl/cli.py)."""
