"""Option YAML files (amptrain/common/yaml_files.py): --config files read as the flags
are typed, bounded against hostile files, and a run's resolved config.yaml read back."""
from __future__ import annotations

import pytest

from amptrain.config import (RESOLVED_ONLY_KEYS, RunConfig, build_config, load_yaml, to_dict,
                             write_yaml)
from amptrain.common.errors import UserError, cli_spelling


def test_yaml_keys_accept_dashes(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("batch-size: 32\nkeep_fp32: [head]\nmodel: mlp\n")
    config = build_config(RunConfig, load_yaml(path))
    assert config.batching.batch_size == 32 and config.precision.keep_fp32 == ["head"]
    assert config.model == "mlp"


def test_yaml_errors_are_user_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(UserError, match="no such file"):
        load_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text,fragment", [
    (b"lr: 1e-3\nmax_steps: 3\n", None),                # YAML 1.1 reads 1e-3 as a string
    (b"lr: abc\n", "--lr must be a number (got 'abc')"),
    (b"keep_fp32: 5\n", "--keep-fp32 takes a pattern"),
    (b"growth_factor: big\n", "--growth-factor must be a number"),
    (b"resume: 7\n", "--resume must be a string"),
    (b"model: {name: mlp}\n", "--model must be a string"),
    (b"", "the file is empty"),
    (b"- lr\n- 3\n", "expected a mapping of option: value (got a YAML list)"),
    (b"lr: \xff\xfe\n", "not UTF-8 text"),
])
def test_yaml_values_are_typed_like_their_flags(tmp_path, text, fragment):
    path = tmp_path / "run.yaml"
    path.write_bytes(text)
    if fragment is None:
        config = build_config(RunConfig, load_yaml(path))
        assert config.schedule.lr == 0.001 and config.schedule.max_steps == 3
        return
    with cli_spelling(), pytest.raises(UserError) as error:
        build_config(RunConfig, load_yaml(path))
    assert fragment in str(error.value)


def test_yaml_of_a_directory_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"is a directory; give the YAML file"):
        load_yaml(tmp_path)


def test_yaml_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 0.1\nepochs: [2,\n")
    with pytest.raises(UserError, match=r"not valid YAML at line \d+$"):
        load_yaml(bad)


def test_a_written_resolved_config_reads_back_as_the_same_config(tmp_path):
    config = build_config(RunConfig, {"model": "mlp", "keep_fp32": ["head"], "lr": 1e-3,
                                      "micro_batch_size": "auto", "no_progress": True})
    # A resolved config.yaml also records facts that are not options.
    resolved = {**to_dict(config), "world_size": 2, "lr_schedule": {"base_lr": 1e-3},
                "micro_batch_search": [], "oom_events": 0}
    assert set(resolved) - set(to_dict(config)) == RESOLVED_ONLY_KEYS
    path = tmp_path / "config.yaml"
    write_yaml(resolved, path)
    assert path.read_text().splitlines()[0] == "device: auto"  # field order, not sorted
    values = load_yaml(path)
    assert not RESOLVED_ONLY_KEYS & set(values)
    assert build_config(RunConfig, values) == config


# ----------------------------------------------------------------- issue 36, class 7
def _billion_laughs() -> str:
    """341 bytes of YAML whose aliases expand to 9^9 strings (an alias bomb)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\nlr: *i\n"


@pytest.mark.parametrize("text,fragment", [
    (_billion_laughs(), "its YAML aliases expand to more than 10000 values"),
    ("lr: " + "[" * 50000 + "]" * 50000 + "\n", "nested too deeply to be a config"),
    ("lr: " + "9" * (1 << 20) + "\n", "bytes, over the limit of 1048576"),
    # Issue 48, class 7: YAML 1.1's base 60 is not a flag's number.
    ("max_steps: 1:00\n", "max_steps must be an integer (got '1:00')"),
    ("lr: 1:30.5\n", "lr must be a number (got '1:30.5')"),
    ("seed: &s 1:00:00\nmax_steps: *s\n", "must be an integer"),
])
def test_a_hostile_config_is_refused_in_a_short_line(tmp_path, text, fragment):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as error:
        build_config(RunConfig, load_yaml(path))
    assert fragment in str(error.value) and len(str(error.value)) < 300


def test_aliases_of_a_sane_size_still_work(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("lr: &rate 0.01\nepochs: 2\nkeep_fp32: [&head head, '*.norm']\n")
    assert load_yaml(path)["lr"] == 0.01
