"""The acceleration configuration: loading from every source, validation messages, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perfscope.runtime.config import CONFIG_ENV, KEYS, AccelConfig, ConfigError, load_config, save_config


def test_sources_give_the_same_configuration(tmp_path, monkeypatch):
    want = AccelConfig(num_workers=4, pin_memory=True, amp_level="O1", bucket_cap_mb=50)
    path = save_config(want, tmp_path / "tuned.yaml", comment="tuned by a test")
    assert load_config(path) == want
    assert load_config(str(path)) == want
    assert load_config(want.to_dict()) == want
    assert load_config(want) is want
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert load_config(None) == want
    monkeypatch.delenv(CONFIG_ENV)
    assert load_config(None) is None


def test_errors_from_the_environment_name_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "gone.yaml"))
    with pytest.raises(ConfigError, match=r"\$PERFSCOPE_CONFIG .*cannot read"):
        load_config(None)


def test_changes_lists_only_what_differs_from_the_defaults():
    assert AccelConfig(num_workers=2, grad_accum_steps=4).changes() == {"num_workers": 2, "grad_accum_steps": 4}


@pytest.mark.parametrize(
    "data, key, allowed",
    [
        ({"num_wrkers": 2}, "num_wrkers", "num_workers"),  # unknown key: names the allowed keys
        ({"amp_level": "O3"}, "amp_level", "O0, O1, O2"),
        ({"amp_dtype": "fp8"}, "amp_dtype", "bf16, fp16"),
        ({"grad_compression": "int8"}, "grad_compression", "none, fp16, bf16"),
        ({"num_workers": -1}, "num_workers", ">= 0"),
        ({"num_workers": True}, "num_workers", ">= 0"),
        ({"grad_accum_steps": 0}, "grad_accum_steps", ">= 1"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb", "> 0"),
        ({"pin_memory": "yes"}, "pin_memory", "true, false"),
        ({"num_workers": 0, "persistent_workers": True}, "persistent_workers", "num_workers > 0"),
    ],
)
def test_bad_configurations_name_the_key_and_the_allowed_values(data, key, allowed):
    with pytest.raises(ConfigError) as e:
        load_config(data)
    assert key in str(e.value) and allowed in str(e.value)


def test_bad_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("num_workers: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")


def test_every_key_is_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    assert [k for k in KEYS if f"`{k}`" not in text] == []


def test_config_module_needs_no_torch():
    code = "import sys, perfscope.runtime.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
