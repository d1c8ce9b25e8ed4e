"""docs/guides/troubleshooting.md quotes the errors "as workbench prints them": each of its ```text blocks is
what the case it describes raises today, compared as the documentation's printed output is (doctest's rules:
``...`` stands for any text, runs of whitespace are equal). A message reworded in the code fails here until the
page follows."""

from __future__ import annotations

import dataclasses
import doctest
import re
from pathlib import Path

import pytest
import torch
from conftest import cli, tiny_base, write_run_config

from workbench import AdapterExperiment, GatedResidual, build
from workbench.adapters.latent_residual import LatentResidual

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "troubleshooting.md"
BLOCKS = re.findall(r"^```text\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def raised(make) -> str:
    """``TYPE: message`` of what ``make()`` raises."""
    try:
        make()
    except Exception as err:  # noqa: BLE001 - whichever workbench raises, named as Python prints it
        return f"{type(err).__name__}: {err}"
    raise AssertionError("nothing was raised")


def first_frame_only(exp, actions):
    first = torch.rand(len(actions) if actions is not None else 1, 3, 16, 16) * 2 - 1
    request = {"image": first} if actions is None else {"image": first, "action": actions}
    return lambda: exp.sample(request, steps=2)


def printed(tmp_path, capsys, monkeypatch) -> dict[str, str]:
    """Each case of the page, by the first words of its block, as it comes out today."""
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1, dim=4))
    trajectory = exp.sample({"image": torch.zeros(1, 3, 16, 16), "action": torch.zeros(1, 4, 4)}, steps=4,
                            record=True)
    monkeypatch.chdir(tmp_path)
    write_run_config(tmp_path / "tiny.yaml", **{"training.learning_rate": 0.001})
    assert cli(capsys, "train", "tiny.yaml", "--output", "outputs/t2", "--steps", 2, "--quiet")[0] == 0
    write_run_config(tmp_path / "tiny.yaml", **{"training.learning_rate": 0.005})  # edited, then resumed
    status, _, resumed = cli(capsys, "train", "tiny.yaml", "--output", "outputs/t2", "--resume", "--steps", 2,
                             "--quiet")
    assert status == 2

    from workbench.data.metaworld import MetaWorldClips
    from workbench.extras import require_all
    from workbench.train.memory import memory_plan

    plan = memory_plan(str(PAGE.parents[2] / "examples" / "configs" / "tiny.yaml"), device="cuda", memory="24GiB")
    gib = 2**30
    # a step that needs 30 GiB, 20 with checkpointing (the weights and training state 10 of them)
    big = dataclasses.replace(plan, weights=8 * gib, trainable=2 * gib, activations=20 * gib,
                              activations_checkpointed=10 * gib)
    verdict = big.table().splitlines()
    monkeypatch.setattr("workbench.extras.missing", lambda extra, modules=None: ["matplotlib"] * (extra == "widgets"))
    return {
        "UnknownComponentError: Unknown adapter": raised(lambda: build("adapter", "latent_resdual", where="adapter")),
        "ConfigError: Invalid LatentResidual": raised(lambda: LatentResidual(depht=2)),
        "ConditionError: LatentResidual consumes condition 'force'": raised(
            lambda: AdapterExperiment(base=tiny_base(), adapter=LatentResidual(condition="force"))),
        "ConditionError: LatentResidual consumes condition 'action'": raised(first_frame_only(exp, None)),
        "ConditionError: LatentResidual: condition 'action'": raised(first_frame_only(exp, torch.rand(2, 4, 7))),
        "ConfigError: Invalid config": raised(lambda: GatedResidual(gate_init=0.5, max_gate=0.4)),
        "error: --resume": resumed.strip(),
        "DataError: Meta-World data file not found": raised(lambda: MetaWorldClips(path="nothere.h5")),
        "StepError: fork(at=9)": raised(lambda: trajectory.fork(at=9)),
        "error: workbench demo needs": "error: " + raised(
            lambda: require_all({"widgets": ["matplotlib"]}, "workbench demo")).split(": ", 1)[1],
        "on 24.00 GiB": next(line for line in verdict if line.startswith("on ")),
    }


# What the page quotes that is not workbench's to print.
NOT_OURS = {"torch.OutOfMemoryError": "torch's own message, quoted for the reader to recognise"}


def test_every_message_on_the_page_is_what_the_code_prints(tmp_path, capsys, monkeypatch):
    got = printed(tmp_path, capsys, monkeypatch)
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    seen = set()
    for block in BLOCKS:
        if block.startswith(tuple(NOT_OURS)):
            continue
        case = next((start for start in got if block.startswith(start)), None)
        assert case is not None, f"a block of the page that no case here produces:\n{block}"
        seen.add(case)
        assert checker.check_output(block, got[case] + "\n", flags), (
            f"the page quotes\n{block}\nthe code prints\n{got[case]}")
    assert seen == set(got), f"cases the page no longer shows: {set(got) - seen}"


@pytest.mark.parametrize("block", BLOCKS[:1])
def test_the_check_can_fail(block):
    """A reworded message no longer matches its quote."""
    checker = doctest.OutputChecker()
    assert not checker.check_output(block, block.replace("Unknown adapter", "Unknown kind of adapter") + "\n",
                                    doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
