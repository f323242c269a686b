"""models/make/trained_inputs.py's Whisper features are Whisper's: a tone lands in the mel bin of its
frequency, the padding of the 30 s window sits at the floor, and the range is the one Whisper's
clipping leaves (8 decades of power, over 4)."""

from __future__ import annotations

import sys

import numpy as np

from conftest import ROOT

sys.path.insert(0, str(ROOT / "models" / "make"))
import trained_inputs as ti  # noqa: E402


def test_a_tone_lands_in_its_mel_bin_and_the_padding_at_the_floor():
    seconds, hz = 2.0, 1000.0
    t = np.arange(int(seconds * ti.WHISPER_SAMPLE_RATE)) / ti.WHISPER_SAMPLE_RATE
    features = ti.whisper_features((0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32))
    assert features.shape == (80, ti.WHISPER_FRAMES)
    filters = ti.whisper_mel_filters()
    tone_bin = int(np.argmax(filters[:, int(round(hz * ti.WHISPER_FFT / ti.WHISPER_SAMPLE_RATE))]))
    assert int(np.argmax(features[:, 100])) == tone_bin
    assert features.max() - features.min() == np.float32(2.0)  # clipped 8 decades below the peak, / 4
    floor = features.min()
    assert np.all(features[:, 300:] == floor)  # after the tone: the zero padding


def test_speech_like_features_are_seeded_and_in_whispers_range():
    a, b = ti.whisper_speech_log_mel(seed=3), ti.whisper_speech_log_mel(seed=3)
    assert a.shape == (1, 80, ti.WHISPER_FRAMES) and np.array_equal(a, b)
    assert not np.array_equal(a, ti.whisper_speech_log_mel(seed=4))
    assert -1.5 < a.min() and a.max() < 2.0 and a.max() - a.min() <= 2.0
    voiced = a[0, :, :400]  # the utterance is at least 4 s: its first 4 s are not all floor
    assert (voiced > a.min()).mean() > 0.5
