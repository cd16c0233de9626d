import json

import pytest
import yaml

from aic.cli import train
from aic.targets import TARGETS, main


@pytest.mark.parametrize("target", list(TARGETS))
def test_each_target_is_a_real_model_setting(target, capsys):
    """The ablation's overrides are options the CLI accepts, and they set what they name."""
    flags = [f"--{key}={value}" for key, value in TARGETS[target].items()]
    with pytest.raises(SystemExit) as info:
        train(["fit", *flags, "--print_config"])
    assert info.value.code == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert (model["voc_horizon"], model["voc_source"]) == (
        TARGETS[target]["model.voc_horizon"],
        TARGETS[target]["model.voc_source"],
    )
    assert len({tuple(sorted(t.items())) for t in TARGETS.values()}) == len(TARGETS)


@pytest.mark.slow  # trains three tiny networks: about a minute on 2 shared cores
def test_the_ablation_writes_every_target_with_intervals(tmp_path):
    main(["--quick", "--seeds", "0", "--prices", "0.01", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "target_ablation.json").read_text())
    assert set(record["results"]) == {f"{t}@0.01" for t in TARGETS}
    assert "return_minus_one_step" in record["results"]["exact_value@0.01"]
    assert record["git_revision"] and record["command"].startswith("python -m aic.targets")
