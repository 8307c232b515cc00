import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moto_harness import Moto  # noqa: E402


@pytest.fixture(scope="session")
def moto(tmp_path_factory):
    m = Moto(str(tmp_path_factory.mktemp("moto")))
    yield m
    m.stop()
