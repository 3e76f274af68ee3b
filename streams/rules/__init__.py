"""The rules: pure decision modules (no I/O, tests/unit/test_import_layers.py checks it) that
the agents, the stores and the command line share."""
