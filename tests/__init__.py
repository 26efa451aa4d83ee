import pytest

# The shared helpers assert too: their failures say what was compared, as the tests' own do.
pytest.register_assert_rewrite("tests.support")
