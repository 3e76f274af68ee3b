"""The command line: `entry.main` parses the arguments, each other module is a command group
exposing `register(subparsers)` (add new ones to registry()). Argument parsing and printing
only: the work is done by the pipeline's packages, and by the lab for demo, bench and chaos."""
