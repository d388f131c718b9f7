from hypothesis import settings

# Same examples on every run: a property test that fails in CI fails on a laptop too.
settings.register_profile("book", derandomize=True, deadline=None, max_examples=60)
settings.load_profile("book")
