"""tests/conftest.py's two tiers: which tests the rules put in the integration tier, and the fast tier's guard against
starting a Python process."""

from __future__ import annotations

import subprocess as child_processes  # aliased: a test body naming `subprocess` joins the integration tier
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import is_integration

ROOT = Path(__file__).resolve().parents[1]


def _item(path: str, name: str = "test_x", fixtures=(), function=None):
    """What :func:`is_integration` reads of a collected test."""
    return SimpleNamespace(path=ROOT / path, name=f"{name}[p]", originalname=name, fixturenames=list(fixtures),
                           function=function or (lambda: None))


def test_the_rules_that_make_a_test_an_integration_test():
    assert is_integration(_item("tests/layers/test_native.py"), ROOT)  # a listed module
    assert is_integration(_item("tests/benchmarks/test_phm.py"), ROOT)  # a listed folder
    assert not is_integration(_item("tests/benchmarks/test_harness.py"), ROOT)  # … less its fast file
    assert is_integration(_item("tests/layers/test_phm.py", "test_torch_compile_fullgraph"), ROOT)  # a listed test
    assert not is_integration(_item("tests/layers/test_phm.py", "test_gradcheck"), ROOT)
    assert is_integration(_item("tests/x/test_y.py", fixtures=["tmp_path", "kernel_cache"]), ROOT)  # a fixture
    assert not is_integration(_item("tests/x/test_y.py", fixtures=["tmp_path", "teacher_folder"]), ROOT)

    def starts_a_child():
        return child_processes.run(["true"]) and subprocess  # noqa: F821 (never called: its names are read)

    def runs_ddp():
        return torchrun("x")  # noqa: F821
    assert is_integration(_item("tests/x/test_y.py", function=starts_a_child), ROOT)
    assert is_integration(_item("tests/x/test_y.py", function=runs_ddp), ROOT)
    assert not is_integration(_item("/elsewhere/test_z.py"), ROOT)  # outside the repository: by its other rules


def test_the_fast_tier_starts_no_python_process():
    with pytest.raises(RuntimeError, match=r"test_tiers.py::test_the_fast_tier_starts_no_python_process starts a "
                                           r"Python process .*INTEGRATION_TESTS"):
        child_processes.run([sys.executable, "-c", "pass"])
    with pytest.raises(RuntimeError, match="starts a Python process"):
        child_processes.call("python3 -c pass", shell=True)  # a shell command line
    assert child_processes.run(["true"]).returncode == 0  # other programs run
