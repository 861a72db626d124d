pytest_plugins = ["tests.fakes.plugin", "tests.support.redis_plugin"]
