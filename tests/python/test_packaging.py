"""pyproject.toml's extras: pip install 'ckptd[torch]', 'ckptd[lightning]',
'ckptd[hf]', 'ckptd[jax]' and 'ckptd[zstd]' bring what ckpt.torch /
ckpt.dcp, ckpt.lightning, ckpt.hf, ckpt.jax / ckpt.orbax and ckpt.format's
reading of compressed steps import; the wheel itself requires none of them."""
import os
import re

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _extras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _names(reqs):
    """The distribution names of requirement strings, lowercased."""
    return {re.match(r"[A-Za-z0-9._-]+", r.strip()).group(0).lower() for r in reqs}


@pytest.mark.parametrize("extra, wanted", [
    ("torch", {"torch"}),
    ("lightning", {"torch", "lightning"}),
    ("hf", {"torch", "transformers", "accelerate"}),
    ("zstd", {"zstandard", "numpy"}),
    ("jax", {"jax", "orbax-checkpoint"}),
])
def test_extra_requires(extra, wanted):
    extras = _extras()
    assert extra in extras, sorted(extras)
    assert _names(extras[extra]) == wanted, extras[extra]


def test_extras_pin_torch_alike():
    """Every extra asks for the same torch as the torch extra."""
    extras = _extras()
    torch_req = [r for r in extras["torch"] if _names([r]) == {"torch"}]
    for name in ("lightning", "hf"):
        assert [r for r in extras[name] if _names([r]) == {"torch"}] == torch_req, extras[name]


def test_zstandard_stays_optional():
    """ckpt.format imports zstandard only for a compressed step: the wheel
    does not require it."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "zstandard" not in _names(project.get("dependencies", [])), project.get("dependencies")


def test_every_module_is_installed():
    """client/python/meson.build installs every module of the package (the
    wheel and meson install hold what it lists, nothing else)."""
    pkg = os.path.join(ROOT, "client", "python", "ckpt")
    with open(os.path.join(ROOT, "client", "python", "meson.build")) as f:
        listed = set(re.findall(r"'ckpt/([^']+)'", f.read()))
    have = {n for n in os.listdir(pkg) if n.endswith(".py") or n == "py.typed"}
    assert have == listed, (sorted(have - listed), sorted(listed - have))
