"""The commands: `analyze`, `diff` and `run`, each in a module of its own."""
