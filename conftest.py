# Wires the harness plugin for runs from the repo root. The same module is also the
# package's pytest11 entry point, registered under the same name, so it loads once.
# pytester drives the plugin tests in tests/.
pytest_plugins = ["harness.plugin", "pytester"]
