"""Straggler trials on rasd-sim's job model: a slowed GPU is named in time, a clean job names no one."""

from __future__ import annotations

from rasd.controller.core import straggler
from rasd.sim import straggler_trial


def test_a_gpu_5_percent_slower_is_named_within_20_steps_and_no_other():
    outcome = straggler_trial.run(
        straggler_trial.Trial(gpus=128, steps=30, slowdown=0.05, seed=5), straggler.StragglerPolicy()
    )
    assert outcome.straggler and outcome.steps_to_localise is not None and outcome.steps_to_localise <= 20
    assert outcome.false_positives == ()


def test_a_clean_job_names_no_one():
    outcome = straggler_trial.run(
        straggler_trial.Trial(gpus=128, steps=150, slowdown=0.0, seed=6), straggler.StragglerPolicy()
    )
    assert outcome.straggler == "" and outcome.steps_to_localise is None
    assert outcome.false_positives == () and outcome.steps_judged == 150
