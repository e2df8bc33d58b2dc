"""Three faults a new-user trial left for the lead: a top-k over the vocabulary broke the next sampled
step, ``.safetensors`` exports were mode 0600 (every other export 0644), and a failed session save
left ``<name>.tmp`` behind."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from attnscope.core.io import sessionfile as SF
from attnscope.core.io.data_writers import write_data
from attnscope.core.sampling import Sampling, filtered_probs


@pytest.mark.parametrize("top_k", [10, 11, 1000])
def test_a_top_k_at_or_over_the_vocabulary_keeps_every_token(top_k):
    logits = np.linspace(-2.0, 3.0, 10)
    s = Sampling(temperature=1.0, top_k=top_k, seed=1)
    p = filtered_probs(logits, s)  # it raised "kth(=-90) out of bounds (10)"
    want = np.exp(logits - logits.max())
    np.testing.assert_allclose(p / p.sum(), want / want.sum(), rtol=1e-12)
    assert (p > 0).all()
    three = filtered_probs(logits, Sampling(temperature=1.0, top_k=3, seed=1))
    assert np.count_nonzero(three) == 3 and three.argmax() == 9


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_data_export_has_the_same_mode(tmp_path, umask):
    w = np.eye(4, dtype=np.float32)
    old = os.umask(umask)
    try:
        modes = {}
        for suffix in ("npy", "csv", "safetensors"):
            (path, _sidecar) = write_data(w, tmp_path / f"m.{suffix}", {"k": 1})
            modes[suffix] = stat.S_IMODE(path.stat().st_mode)
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(modes, 0o666 & ~umask), modes


def test_a_failed_session_save_leaves_no_temporary_file(smol_ran, tmp_path):
    sf = SF.SessionFile.from_session(smol_ran)
    (tmp_path / "s.attnscope").mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(OSError):
        SF.save(sf, tmp_path / "s.attnscope")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.attnscope"]
    assert SF.save(sf, tmp_path / "t.attnscope").is_file()
    assert not (tmp_path / "t.attnscope.tmp").exists()
