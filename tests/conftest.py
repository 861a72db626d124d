import os

from hypothesis import settings

pytest_plugins = ["tests.fakes.plugin", "tests.support.redis_plugin"]

# No per-example deadline anywhere: this VM can freeze a vCPU for about a second, which a 200 ms deadline
# would report as "unreliable test timings". HYPOTHESIS_PROFILE=thorough explores 20x more examples.
settings.register_profile("default", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
