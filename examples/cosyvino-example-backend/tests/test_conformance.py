"""The example plugin passes cosyvino's backend conformance suite, and logs its stage times."""

from __future__ import annotations

import logging

import numpy as np

from cosyvino.testing import TINY_MODEL_DIR, BackendConformance


class TestLoggingTorch(BackendConformance):
    backend = "logging-torch"


def test_stage_calls_are_timed_and_logged(caplog):
    from cosyvino.plugins import get_backend

    stages = get_backend("logging-torch").load(str(TINY_MODEL_DIR))
    with caplog.at_level(logging.DEBUG, logger="cosyvino_example_backend"):
        out = stages.encode_text(np.array([[1, 2, 3]], np.int64))
        stages.new_llm_session().forward(np.zeros((1, 2, out.shape[-1]), np.float32))
    assert stages.calls == {"encode_text": 1, "llm_forward": 1}
    assert all(s > 0 for s in stages.seconds.values())
    assert [r.getMessage().split()[0] for r in caplog.records] == ["encode_text", "llm_forward"]
