"""The generated config documentation: docs/config.md, the commented templates and the `#:` comments
of configs/*.yaml, all read from the schema (the config dataclasses and the registries)."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from hyperplex.config import ConfigError, load_yaml, parse_overrides
from hyperplex.config.experiment import TrainingConfig, build_experiment, experiment_dict
from hyperplex.config.reference import (
    MARK,
    annotate_files,
    annotate_text,
    config_reference,
    config_template,
    main,
    strip_generated,
    template_values,
)
from hyperplex.config.registry import ARCHITECTURES, TASKS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
ARCH_TASKS = [(a, t) for a, arch in ARCHITECTURES.items() for t, task in TASKS.items() if arch.family in task.families]


def test_config_reference_is_up_to_date():
    # docs/config.md is generated from the config classes; regenerate with
    # `hyperplex config-reference > docs/config.md` after changing any config field.
    assert DOC.read_text(encoding="utf-8") == config_reference()


def test_reference_covers_every_architecture_and_nested_defaults():
    text = config_reference()
    for name in ("rnn_translator", "transformer", "nli_encoder", "decomposable_attention", "quaternion_attention"):
        assert f"`architecture: {name}`" in text
    assert "`training.lr`" in text and "`testing.beam_size`" in text and "`model.linear.kind`" in text


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        out.update(leaves(value, dotted) if isinstance(value, dict) and value else {dotted: value})
    return out


def comment_above(lines: list[str], number: int) -> str:
    """The text of the `#:` lines directly above line ``number`` (0-based), joined by spaces."""
    block = []
    while number > 0 and lines[number - 1].lstrip().startswith(MARK):
        number -= 1
        block.insert(0, lines[number].lstrip()[len(MARK):].strip())
    return " ".join(block)


# ---------------------------------------------------------------------------- templates
@pytest.mark.parametrize(("architecture", "task"), ARCH_TASKS, ids=lambda v: str(v))
def test_template_holds_every_key_at_its_default(tmp_path, architecture, task):
    path = tmp_path / "template.yaml"
    path.write_text(config_template(architecture, task), encoding="utf-8")
    raw = load_yaml(path)
    cfg = build_experiment(raw)
    assert type(cfg.model) is ARCHITECTURES[architecture].load()[0] and cfg.data.task == task
    # Only the keys the template sets on purpose differ from what the dataclasses fill in themselves
    # (a config of just those keys), and no key of the resolved config is missing from the template.
    overrides = [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
                 for key, value in template_values(architecture, task).items()]
    minimal = build_experiment(parse_overrides(overrides))
    assert experiment_dict(cfg) == experiment_dict(minimal)
    assert set(leaves(raw)) == set(leaves(experiment_dict(cfg)))
    # Its comments are exactly the annotator's, so a template stays current under --annotate --check.
    text = path.read_text(encoding="utf-8")
    assert annotate_text(text) == text


def test_template_comment_states_help_choices_and_default():
    lines = config_template("nli_encoder", "ranking").splitlines()
    schedule = next(f for f in dataclasses.fields(TrainingConfig) if f.name == "schedule")
    comment = comment_above(lines, lines.index("  schedule: constant"))
    assert " ".join(schedule.metadata["help"].split()) in comment
    assert "choices: constant | inverse_sqrt | halving | linear_decay · default: constant" in comment
    # A nested section's default comes from its default object: Q-Att's `linear` defaults to quaternion.
    qatt = config_template("quaternion_attention").splitlines()
    kind = [i for i, line in enumerate(qatt) if line == "    kind: quaternion"]
    assert len(kind) == 1 and comment_above(qatt, kind[0]).endswith("default: quaternion")


def test_template_of_an_unknown_architecture_or_wrong_task_names_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown architecture 'transfomer'.*did you mean 'transformer'"):
        config_template("transfomer")
    with pytest.raises(ConfigError, match="cannot do task 'classification'; valid for it: transformer_classifier"):
        config_template("transformer", "classification")


# ---------------------------------------------------------------------------- annotating
SAMPLE = """\
# hand-written header
name: sample   # trailing comment
#: a stale generated line
model_dir: runs/sample

data:
  task: translation
  src: en
  tgt: de
  labels:
    - a
    - b
model:
  architecture: transformer
  # a hand-written note on the linear maps
  linear: {kind: phm, n: 2}
training:
  #: lr, in an old wording
  lr: 0.5     # tuned
  max_steps: 10
"""


def test_annotation_is_idempotent_and_keeps_hand_written_lines():
    once = annotate_text(SAMPLE)
    assert annotate_text(once) == once
    kept = [line for line in SAMPLE.splitlines(keepends=True) if not line.lstrip().startswith(MARK)]
    assert strip_generated(once) == "".join(kept)
    assert yaml.safe_load(once) == yaml.safe_load(SAMPLE)
    assert "a stale generated line" not in once and "in an old wording" not in once


def test_annotation_puts_the_current_help_and_default_above_every_key():
    lines = annotate_text(SAMPLE).splitlines()
    lr = next(f for f in dataclasses.fields(TrainingConfig) if f.name == "lr")
    comment = comment_above(lines, lines.index("  lr: 0.5     # tuned"))
    assert comment == f"{' '.join(lr.metadata['help'].split())} · type: float · default: {lr.default}"
    # A block sequence, a section and each block key get their own comment, at the key's indentation.
    for key_line in ("  labels:", "model:", "  architecture: transformer", "training:",
                     "name: sample   # trailing comment"):
        number = lines.index(key_line)
        indent = key_line[:len(key_line) - len(key_line.lstrip())]
        assert lines[number - 1].startswith(indent + MARK + " "), key_line
    # The flow mapping gets one comment naming the keys it sets, below the hand-written note.
    number = lines.index("  linear: {kind: phm, n: 2}")
    flow = comment_above(lines, number)
    assert "- kind: " in flow and "- n: " in flow and "- rule:" not in flow
    first = number
    while lines[first - 1].startswith("  " + MARK):
        first -= 1
    assert lines[first - 1] == "  # a hand-written note on the linear maps"


def test_unknown_keys_are_reported_with_file_and_line_and_nothing_is_written(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(SAMPLE, encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad_text = SAMPLE.replace("  src: en", "  source: en").replace("{kind: phm, n: 2}", "{kind: phm, m: 2}")
    bad.write_text(bad_text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        annotate_files([good, bad])
    assert f"{bad}:8: unknown config key 'data.source'" in str(err.value)
    assert f"{bad}:16: unknown config key 'model.linear.m'" in str(err.value)
    assert good.read_text(encoding="utf-8") == SAMPLE and bad.read_text(encoding="utf-8") == bad_text


def test_a_generated_marker_inside_a_multiline_string_is_refused():
    with pytest.raises(ConfigError, match="would change the config"):
        annotate_text("name: |\n  first\n  #: part of the name\nmodel: {architecture: transformer}\n")


def test_cli_check_then_annotate(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(SAMPLE, encoding="utf-8")
    assert main(["--annotate", "--check", str(path)]) == 1
    assert path.read_text(encoding="utf-8") == SAMPLE
    assert f"{path}: `#:` comments are not current" in capsys.readouterr().out
    assert main(["--annotate", str(path)]) == 0
    assert main(["--annotate", str(path), "--check"]) == 0
    assert path.read_text(encoding="utf-8") == annotate_text(SAMPLE)


# ---------------------------------------------------------------------------- the shipped configs
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_comments_are_current_and_change_nothing(tmp_path, path):
    text = path.read_text(encoding="utf-8")
    assert annotate_files([path], check=True) == [], f"run: hyperplex config-reference --annotate {path}"
    # The same config with and without the generated lines.
    bare = tmp_path / path.name
    bare.write_text(strip_generated(text), encoding="utf-8")
    assert load_yaml(bare) == load_yaml(path)
    assert annotate_text(bare.read_text(encoding="utf-8")) == text
    # Every key on its own line has a `#:` comment directly above it, at its indentation.
    lines = text.split("\n")

    def check(node):
        for key, value in node.value:
            line = lines[key.start_mark.line]
            if not (isinstance(node, yaml.MappingNode) and node.flow_style):
                assert lines[key.start_mark.line - 1].startswith(" " * key.start_mark.column + MARK), line
            if isinstance(value, yaml.MappingNode) and not value.flow_style:
                check(value)

    check(yaml.compose(text))
