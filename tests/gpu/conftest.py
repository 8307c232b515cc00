"""The python suite's fixtures (a real ckptd on a temporary socket from
CKPTD_BIN, libckpt from CKPT_LIB), for the tests that need a real GPU.
tests/gpu/run.sh sets both."""
import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "conftest.py")
_spec = importlib.util.spec_from_file_location("ckpt_python_conftest", _path)
_m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_m)

ROOT = _m.ROOT
Daemon = _m.Daemon
daemon_factory = _m.daemon_factory
