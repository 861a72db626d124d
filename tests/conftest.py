pytest_plugins = ["tests.fakes.plugin"]
