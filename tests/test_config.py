"""scripts/config.yaml and its loader: typed validation and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_script
from kernel_harness.config import KNOWN_KEYS, load_config
from kernel_harness.errors import UsageError
from kernel_harness.paths import DEFAULT_CONFIG_PATH

VALID = {
    "max_trials": 5,
    "early_stop_speedup": 4.0,
    "perf_stat_enabled": True,
    "vtune_enabled": False,
    "vtune_bin": "vtune",
    "build_command": "{python} {scripts}/build_kernel.py --release",
    "install_command": "{python} -m pip install dist/*.whl --force-reinstall --no-deps",
}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_shipped_config_loads_and_expands_placeholders():
    config = load_config(DEFAULT_CONFIG_PATH)
    assert config.max_trials >= 1 and config.early_stop_speedup > 1
    assert "{python}" not in config.build_command and "{scripts}" not in config.build_command
    assert "build_kernel.py" in config.build_command
    assert "--force-reinstall" in config.install_command


def test_cached_test_builds_are_keyed_by_the_command_not_the_checkout():
    # The suite's built packages are cached by content; the expanded build command names this
    # checkout's scripts and interpreter, which a fresh clone (CI's) changes without changing
    # what gets built.
    from fixtures_kernels import portable_command

    config = load_config(DEFAULT_CONFIG_PATH)
    assert portable_command(config.build_command) == yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())["build_command"]


def test_env_var_points_at_another_file(tmp_path, monkeypatch):
    path = write(tmp_path, {**VALID, "max_trials": 3})
    monkeypatch.setenv("KERNEL_HARNESS_CONFIG", str(path))
    assert load_config().max_trials == 3


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("max_trials", 0, "positive integer"),
        ("max_trials", -2, "positive integer"),
        ("max_trials", 2.5, "positive integer"),
        ("max_trials", True, "positive integer"),
        ("early_stop_speedup", 1.0, "greater than 1"),
        ("early_stop_speedup", "fast", "greater than 1"),
        ("perf_stat_enabled", "yes", "true or false"),
        ("vtune_enabled", 1, "true or false"),
        ("build_command", "", "must not be empty"),
        ("install_command", "   ", "must not be empty"),
        ("build_command", 7, "must be a string"),
        ("noise_threshold", -0.01, "fraction between 0 and 0.5"),
        ("noise_threshold", 0.9, "fraction between 0 and 0.5"),
        ("noise_threshold", "5%", "fraction between 0 and 0.5"),
        ("noise_threshold", True, "fraction between 0 and 0.5"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(tmp_path, key, value, fragment):
    path = write(tmp_path, {**VALID, key: value})
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert key in info.value.message and fragment in info.value.message
    assert str(path) in info.value.message


def test_unknown_key_names_it_and_lists_known_keys(tmp_path):
    path = write(tmp_path, {**VALID, "max_trial": 4})
    with pytest.raises(UsageError) as info:
        load_config(path)
    assert "'max_trial'" in info.value.message
    assert all(key in info.value.message for key in KNOWN_KEYS)


def test_missing_key_is_an_error(tmp_path):
    data = dict(VALID)
    del data["max_trials"]
    with pytest.raises(UsageError, match="missing key.*max_trials"):
        load_config(write(tmp_path, data))


def test_noise_threshold_is_optional_with_the_documented_default(tmp_path):
    assert "noise_threshold" not in VALID  # a file written before the key existed still loads
    assert load_config(write(tmp_path, VALID)).noise_threshold == 0.05
    assert load_config(write(tmp_path, {**VALID, "noise_threshold": 0.02})).noise_threshold == 0.02
    assert load_config(DEFAULT_CONFIG_PATH).noise_threshold == 0.05


def test_vtune_bin_required_only_when_vtune_enabled(tmp_path):
    assert load_config(write(tmp_path, {**VALID, "vtune_bin": ""})).vtune_bin == ""
    with pytest.raises(UsageError, match="vtune_bin"):
        load_config(write(tmp_path, {**VALID, "vtune_enabled": True, "vtune_bin": ""}))


@pytest.mark.parametrize("text", ["max_trials: [1, 2\n", "- a\n- b\n"])
def test_malformed_yaml_is_reported(tmp_path, text):
    with pytest.raises(UsageError) as info:
        load_config(write(tmp_path, text))
    assert str(tmp_path / "config.yaml") in info.value.message


def test_cli_prints_values_and_writes_json(tmp_path):
    path = write(tmp_path, VALID)
    proc = run_script("config", "--json", tmp_path / "c.json", cwd=tmp_path, env={"KERNEL_HARNESS_CONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert "max_trials" in proc.stdout
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["max_trials"] == 5 and data["source"] == str(path.resolve())


def test_cli_missing_file_says_which_file_and_exits_2(tmp_path):
    missing = tmp_path / "nope.yaml"
    proc = run_script("config", cwd=tmp_path, env={"KERNEL_HARNESS_CONFIG": str(missing)})
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "Traceback" not in proc.stderr
