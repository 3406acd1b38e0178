"""The annotations are part of the API (the package ships ``py.typed``): the package type-checks with mypy, and the
README's Python examples, as a user would paste them, type-check against it. A wrong annotation on a public signature
(a config field that says ``tuple`` where the docs pass a list, a return type the docs unpack differently) fails
here."""

import re
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy comes with the lint extra")

ROOT = Path(__file__).resolve().parents[1]


def readme_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def run_mypy(tmp_path: Path, *args: str) -> tuple[str, str, int]:
    """mypy from a clean cache in ``tmp_path``, so no earlier run's results stand in for this one's."""
    return mypy_api.run(["--no-incremental", "--cache-dir", str(tmp_path / "mypy_cache"), *args])


def test_the_package_declares_its_annotations():
    assert (ROOT / "src" / "hyperplex" / "py.typed").is_file()
    assert '"hyperplex" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_readme_examples_type_check(tmp_path):
    examples = readme_examples()
    assert len(examples) >= 2  # the drop-in layer and the pretrained model
    files = []
    for i, code in enumerate(examples):
        files.append(tmp_path / f"readme_example_{i}.py")
        files[-1].write_text(code, encoding="utf-8")
    # the weights package and sentence-transformers are the examples' own imports, not hyperplex's API
    out, err, status = run_mypy(tmp_path, "--ignore-missing-imports", "--no-error-summary", *map(str, files))
    assert status == 0, out + err


def test_the_package_and_scripts_type_check(tmp_path, monkeypatch):
    """Every annotation in the package agrees with how the package and the benchmark scripts use it (mypy on the
    ``files`` and with the settings of pyproject.toml): a signature that drifts from its callers, or an attribute
    read as the wrong type, fails here rather than in a user's own type check."""
    monkeypatch.chdir(ROOT)  # the configured files are relative to the repository root
    out, err, status = run_mypy(tmp_path, "--config-file", str(ROOT / "pyproject.toml"))
    assert status == 0, out + err
    checked = re.search(r"no issues found in (\d+) source files", out)
    package = len(list((ROOT / "src" / "hyperplex").rglob("*.py")))
    assert checked and int(checked.group(1)) > package, out  # the whole package, and the scripts beside it


def test_a_wrong_use_of_the_api_is_caught(tmp_path):
    """The check can fail: unpacking ``from_linear`` as one layer (it returns the layer and its error) is an error."""
    code = ("from torch import nn\nfrom hyperplex import PHMLinear\n"
            "layer: PHMLinear = PHMLinear.from_linear(nn.Linear(8, 8), 4)\n")
    (tmp_path / "wrong.py").write_text(code, encoding="utf-8")
    out, _, status = run_mypy(tmp_path, str(tmp_path / "wrong.py"))
    assert status == 1 and "tuple[PHMLinear, float]" in out, out
