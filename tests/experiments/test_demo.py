"""`hyperplex demo`: the paper's Fig. 2 experiments converge and the CLI writes its plots."""

import subprocess
import sys

import pytest
import torch

from hyperplex.algebra import algebra_rule
from hyperplex.cli import main
from hyperplex.experiments.demo import learn_rotation, learn_rule, rotation_matrix


def test_rotation_matrix_is_orthogonal():
    R = rotation_matrix(torch.tensor([1.0, 2.0, 3.0]), 1.0)
    torch.testing.assert_close(R @ R.T, torch.eye(3), atol=1e-6, rtol=0)
    assert torch.det(R).item() == pytest.approx(1.0, abs=1e-6)


def test_phm_layer_learns_a_rotation():
    result = learn_rotation(steps=300)
    assert result.losses[0] > 1e-2 and result.final_loss < 1e-6


@pytest.mark.parametrize("algebra", ["quaternion", "octonion"])
def test_learned_rule_converges_to_the_algebra(algebra):
    result = learn_rule(algebra, steps=400)
    assert result.final_loss < 1e-6
    assert result.rule_error < 1e-3
    torch.testing.assert_close(result.learned_rule, algebra_rule(algebra), atol=1e-3, rtol=0)


def test_cli_demo_quick_prints_table_and_writes_plots(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "quaternion product" in out and "octonion product" in out and "3-D rotation" in out
    for name in ["loss_curves.png", "rule_quaternion.png", "rule_octonion.png"]:
        path = tmp_path / "out" / name
        assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_cli_unwritable_output_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run([sys.executable, "-m", "hyperplex", "demo", "--quick", "--out", str(blocker / "sub")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("hyperplex demo: error:") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
