"""The parity harness's comparison (qtts_lib.bench.parity.divergence): where two code grids first differ, and for
codebook 0 the reference's logits there."""
import numpy as np

from qtts_lib.bench.parity import divergence


def test_equal_codes_have_no_divergence():
    codes = np.arange(48 * 16).reshape(48, 16)
    assert divergence(codes, codes.copy(), np.zeros((48, 8))) is None


def test_first_difference_in_codebook_0_reports_the_margin():
    ref = np.zeros((4, 16), int)
    ours = ref.copy()
    ours[2, 0], ours[3, 5] = 1, 7
    logits = np.zeros((4, 8))
    logits[2, [0, 1]] = [3.0, 2.75]
    d = divergence(ours, ref, logits)
    assert (d["frame"], d["codebook"], d["ours"], d["reference"]) == (2, 0, 1, 0)
    assert d["logit_reference"] == 3.0 and d["logit_ours"] == 2.75 and d["margin"] == 0.25


def test_a_later_codebook_or_an_early_stop():
    ref = np.zeros((4, 16), int)
    ours = ref.copy()
    ours[1, 9] = 5
    assert divergence(ours, ref, np.zeros((4, 8)))["codebook"] == 9
    d = divergence(ref[:3], ref, np.zeros((4, 8)))
    assert d["frame"] == 3 and d["lengths"] == [3, 4]
